package as2

import (
	"bytes"
	"crypto"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pair makes two profiles that know each other: idem (IDEMCO) and a partner
// (PARTNER), with the agreement ag used in both directions.
func pair(t testing.TB, ag Partner) (idem, partner *Profile, us, them *party) {
	dir := t.TempDir()
	us, them = newParty(t, dir, "idem", 1), newParty(t, dir, "partner", 2)
	toPartner, toUs := ag, ag
	toPartner.AS2ID, toPartner.Certificate = "PARTNER", them.cert
	toUs.AS2ID, toUs.Certificate = "IDEMCO", us.cert
	idem = &Profile{AS2ID: "IDEMCO", Certificate: us.cert, Key: us.key, Partners: map[string]*Partner{"PARTNER": &toPartner}}
	partner = &Profile{AS2ID: "PARTNER", Certificate: them.cert, Key: them.key, Partners: map[string]*Partner{"IDEMCO": &toUs}}
	return idem, partner, us, them
}

func TestRoundTripEveryAgreement(t *testing.T) {
	for _, sign := range []crypto.Hash{0, crypto.SHA1, crypto.SHA256, crypto.SHA512} {
		for _, enc := range []Encryption{EncryptNone, EncryptDES3, EncryptAES128CBC, EncryptAES256CBC, EncryptAES256GCM} {
			for _, mdnSign := range []crypto.Hash{0, crypto.SHA256} {
				name := fmt.Sprintf("sign=%s/encrypt=%s/mdn_sign=%s", micalgName(sign), enc, micalgName(mdnSign))
				t.Run(name, func(t *testing.T) {
					idem, partner, _, _ := pair(t, Partner{Sign: sign, Encrypt: enc, MDN: MDNSync, MDNSign: mdnSign})
					out, err := idem.Pack(idem.Partners["PARTNER"], "msg-1@idem", "application/edi-x12", []byte(interchange), "Mon, 30 Nov 2026 08:00:00 GMT")
					if err != nil {
						t.Fatal(err)
					}
					in, err := partner.Unpack(out.Header, out.Body)
					if err != nil {
						t.Fatal(err)
					}
					if string(in.Payload) != interchange || in.ContentType != "application/edi-x12" || in.MessageID != "msg-1@idem" {
						t.Fatalf("unpacked %q (%s), id %q", in.Payload, in.ContentType, in.MessageID)
					}
					if in.Signed != (sign != 0) || in.Encrypted != (enc != EncryptNone) {
						t.Fatalf("signed %v, encrypted %v", in.Signed, in.Encrypted)
					}
					h, body, err := partner.BuildMDN(in, nil, time.Now())
					if err != nil {
						t.Fatal(err)
					}
					m, err := ParseMDN(h, body, idem.Partners["PARTNER"])
					if err != nil {
						t.Fatal(err)
					}
					if err := out.Check(m, "msg-1@idem", idem.Partners["PARTNER"]); err != nil {
						t.Fatalf("the receipt does not acknowledge the message: %v (MDN %+v)", err, m)
					}
				})
			}
		}
	}
}

func TestRefusals(t *testing.T) {
	ag := Partner{Sign: crypto.SHA256, Encrypt: EncryptAES256CBC, MDN: MDNSync, MDNSign: crypto.SHA256}
	idem, partner, _, _ := pair(t, ag)
	out, err := idem.Pack(idem.Partners["PARTNER"], "msg-2@idem", "application/edi-x12", []byte(interchange), "Mon, 30 Nov 2026 08:00:00 GMT")
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, h http.Header, body []byte, p *Profile, modifier string) {
		// The error MDN is verified with the certificate of whoever answers.
		answerer := &Partner{AS2ID: p.AS2ID, Certificate: p.Certificate}
		t.Helper()
		in, err := p.Unpack(h, body)
		var f *Failure
		if !errors.As(err, &f) || f.Modifier != modifier {
			t.Fatalf("%s: %v, want %s", name, err, modifier)
		}
		// The error MDN names it and carries no MIC.
		mh, mbody, err := p.BuildMDN(in, f, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if in.Partner != nil {
			m, err := ParseMDN(mh, mbody, answerer)
			if err != nil || m.Processed() || m.Modifier() != "error: "+modifier || m.OriginalMessageID != "msg-2@idem" {
				t.Fatalf("%s: error MDN %+v, %v", name, m, err)
			}
		}
	}
	// Unknown partner.
	stranger := out.Header.Clone()
	stranger.Set("AS2-From", "STRANGER")
	check("unknown partner", stranger, out.Body, partner, AuthenticationFailed)
	// Encrypted to someone else: a third party's profile cannot decrypt.
	third, _, _, _ := pair(t, ag)
	third.AS2ID = "PARTNER"
	third.Partners = map[string]*Partner{"IDEMCO": partner.Partners["IDEMCO"]}
	check("not ours to decrypt", out.Header, out.Body, third, DecryptionFailed)
	// Signed by an impostor: a message packed by another IDEMCO key.
	impostor, _, _, _ := pair(t, ag)
	impostor.Partners["PARTNER"].Certificate = partner.Certificate
	fake, err := impostor.Pack(impostor.Partners["PARTNER"], "msg-2@idem", "application/edi-x12", []byte(interchange), "Mon, 30 Nov 2026 08:00:00 GMT")
	if err != nil {
		t.Fatal(err)
	}
	// Inside an encrypted message every failure is decryption-failed (no
	// oracle); signed only, the signature's failure is named.
	check("impostor's signature, encrypted", fake.Header, fake.Body, partner, DecryptionFailed)
	signedOnly := ag
	signedOnly.Encrypt = EncryptNone
	idem2, partner2, _, _ := pair(t, signedOnly)
	impostor2, _, _, _ := pair(t, signedOnly)
	impostor2.Partners["PARTNER"].Certificate = partner2.Certificate
	fake2, err := impostor2.Pack(impostor2.Partners["PARTNER"], "msg-2@idem", "application/edi-x12", []byte(interchange), "Mon, 30 Nov 2026 08:00:00 GMT")
	if err != nil {
		t.Fatal(err)
	}
	_ = idem2
	check("impostor's signature", fake2.Header, fake2.Body, partner2, AuthenticationFailed)
}

// TestMDNChecks: a receipt is an ack only for our message id, a processed
// disposition, our MIC, and a signature when one was asked for.
func TestMDNChecks(t *testing.T) {
	ag := Partner{Sign: crypto.SHA256, MDN: MDNSync, MDNSign: crypto.SHA256}
	idem, partner, _, _ := pair(t, ag)
	out, _ := idem.Pack(idem.Partners["PARTNER"], "msg-3@idem", "application/edi-x12", []byte(interchange), "Mon, 30 Nov 2026 08:00:00 GMT")
	in, err := partner.Unpack(out.Header, out.Body)
	if err != nil {
		t.Fatal(err)
	}
	pt := idem.Partners["PARTNER"]
	mdnFor := func(in *Incoming, f *Failure) *MDN {
		h, b, err := partner.BuildMDN(in, f, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		m, err := ParseMDN(h, b, pt)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	wrongMIC := *in
	wrongMIC.MIC = mic([]byte("other"), crypto.SHA256)
	other := *in
	other.MessageID = "msg-other@idem"
	unsigned := *in
	unsigned.MDNSign = 0
	for name, c := range map[string]struct {
		m    *MDN
		want string
	}{
		"wrong MIC":       {mdnFor(&wrongMIC, nil), "MIC"},
		"another message": {mdnFor(&other, nil), "answers"},
		"error":           {mdnFor(in, fail(UnexpectedProcessingError, errors.New("x"))), "reports"},
		"unsigned":        {mdnFor(&unsigned, nil), "not signed"},
	} {
		if err := out.Check(c.m, "msg-3@idem", pt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %q", name, err, c.want)
		}
	}
	if err := out.Check(mdnFor(in, nil), "msg-3@idem", pt); err != nil {
		t.Fatal(err)
	}
	// A signed MDN whose signature does not verify is refused.
	h, b, _ := partner.BuildMDN(in, nil, time.Now())
	if _, err := ParseMDN(h, bytes.Replace(b, []byte("processed"), []byte("processeD"), 1), pt); err == nil {
		t.Fatal("a tampered signed MDN parsed")
	}
}

// TestMICAgreesWithOpenSSL: the MIC of a signed message is the digest of
// the signed entity, headers included, as openssl dgst computes it.
func TestMICAgreesWithOpenSSL(t *testing.T) {
	idem, partner, _, _ := pair(t, Partner{Sign: crypto.SHA256, MDN: MDNSync})
	out, _ := idem.Pack(idem.Partners["PARTNER"], "msg-4@idem", "application/edi-x12", []byte(interchange), "Mon, 30 Nov 2026 08:00:00 GMT")
	signed := entity("application/edi-x12", []byte(interchange), "Content-Transfer-Encoding", "binary")
	want := out.MIC
	digest := openssl(t, signed, "dgst", "-sha256", "-binary")
	if b64 := openssl(t, digest, "base64", "-A"); string(b64) != want {
		t.Fatalf("openssl dgst gives %s, we %s", b64, want)
	}
	in, err := partner.Unpack(out.Header, out.Body)
	if err != nil || in.MIC != want {
		t.Fatalf("the receiver's MIC %q, %v; want %s", in.MIC, err, want)
	}
}

// TestOpenSSLSentMessages: messages OpenSSL's smime signs and encrypts (as
// another AS2 product would), in base64 and binary, are accepted.
func TestOpenSSLSentMessages(t *testing.T) {
	idem, _, us, them := pair(t, Partner{Sign: crypto.SHA256, Encrypt: EncryptAES256CBC, MDN: MDNSync, MDNSign: crypto.SHA256})
	dir := t.TempDir()
	inner := entity("application/edi-x12", []byte(interchange), "Content-Transfer-Encoding", "binary")
	innerPath := filepath.Join(dir, "inner")
	if err := os.WriteFile(innerPath, inner, 0o600); err != nil {
		t.Fatal(err)
	}
	// Sign (detached, multipart/signed) as the partner, then encrypt to us.
	signed := openssl(t, nil, "smime", "-sign", "-binary", "-md", "sha256", "-signer", them.certPath, "-inkey", them.keyPath, "-in", innerPath)
	for _, form := range []string{"SMIME", "DER"} {
		enc := openssl(t, signed, "smime", "-encrypt", "-binary", "-aes256", "-outform", form, us.certPath)
		h := http.Header{}
		body := enc
		if form == "SMIME" {
			eh, eb, err := splitEntity(enc)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range eh {
				h[k] = v
			}
			body = eb
		} else {
			h.Set("Content-Type", "application/pkcs7-mime; smime-type=enveloped-data")
		}
		h.Set("Message-ID", "<openssl-1@partner>")
		h.Set("AS2-From", "PARTNER")
		h.Set("AS2-To", "IDEMCO")
		h.Set("Disposition-Notification-To", "x")
		h.Set("Disposition-Notification-Options", "signed-receipt-protocol=optional, pkcs7-signature; signed-receipt-micalg=optional, sha-256")
		in, err := idem.Unpack(h, body)
		if err != nil {
			t.Fatalf("%s: %v", form, err)
		}
		if string(in.Payload) != interchange || !in.Signed || !in.Encrypted {
			t.Fatalf("%s: payload %q signed %v encrypted %v", form, in.Payload, in.Signed, in.Encrypted)
		}
	}
}
