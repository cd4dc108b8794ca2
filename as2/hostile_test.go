package as2

import (
	"bytes"
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

const testDate = "Mon, 30 Nov 2026 08:00:00 GMT"

// TestAgreementIsEnforced: a partner whose agreement says sign and encrypt
// is accepted only signed and encrypted. A message with less is refused as
// insufficient-message-security (plain, signed only) or, encrypted, as
// decryption-failed (every failure inside an encrypted message is answered
// alike); the same message with everything the agreement asks for is
// authenticated.
func TestAgreementIsEnforced(t *testing.T) {
	strict := Partner{Sign: crypto.SHA256, Encrypt: EncryptAES256CBC, MDN: MDNSync, MDNSign: crypto.SHA256}
	idem, partner, _, _ := pair(t, strict)
	for _, c := range []struct {
		name     string
		sign     crypto.Hash
		enc      Encryption
		modifier string
	}{
		{"neither signed nor encrypted", 0, EncryptNone, InsufficientMessageSecurity},
		{"signed, not encrypted", crypto.SHA256, EncryptNone, InsufficientMessageSecurity},
		{"encrypted, not signed", 0, EncryptAES256CBC, DecryptionFailed},
	} {
		weak := *idem.Partners["PARTNER"]
		weak.Sign, weak.Encrypt = c.sign, c.enc
		out, err := idem.Pack(&weak, "weak@idem", "application/edi-x12", []byte(interchange), testDate)
		if err != nil {
			t.Fatal(err)
		}
		in, err := partner.Unpack(out.Header, out.Body)
		var f *Failure
		if !errors.As(err, &f) || f.Modifier != c.modifier {
			t.Errorf("%s: %v, want %s", c.name, err, c.modifier)
			continue
		}
		if in.Authenticated {
			t.Errorf("%s: authenticated", c.name)
		}
	}
	out, err := idem.Pack(idem.Partners["PARTNER"], "strict@idem", "application/edi-x12", []byte(interchange), testDate)
	if err != nil {
		t.Fatal(err)
	}
	in, err := partner.Unpack(out.Header, out.Body)
	if err != nil || !in.Authenticated {
		t.Fatalf("the agreed message: %v, authenticated %v", err, in.Authenticated)
	}
	// A partner that neither signs nor encrypts is known by name only.
	lax, laxPartner, _, _ := pair(t, Partner{MDN: MDNSync})
	plain, _ := lax.Pack(lax.Partners["PARTNER"], "lax@idem", "application/edi-x12", []byte(interchange), testDate)
	if in, err := laxPartner.Unpack(plain.Header, plain.Body); err != nil || !in.Authenticated {
		t.Fatalf("a plain message under a plain agreement: %v", err)
	}
}

// envelopeCBC writes an EnvelopedData addressed to recipient whose content
// key (RSA PKCS#1 v1.5 encrypted) is key and whose encrypted content is
// sealed, under the content encryption oid with iv: the raw material of a
// padding-oracle attack, for which the test, unlike an attacker, knows the
// key.
func envelopeCBC(t *testing.T, recipient *x509.Certificate, oid asn1.ObjectIdentifier, key, iv, sealed []byte) []byte {
	t.Helper()
	//lint:ignore SA1019 the test encrypts as a partner does
	encKey, err := rsa.EncryptPKCS1v15(rand.Reader, recipient.PublicKey.(*rsa.PublicKey), key)
	if err != nil {
		t.Fatal(err)
	}
	ivParam, _ := asn1.Marshal(iv)
	der, err := wrapContentInfo(oidEnvelopedData, envelopedData{
		RecipientInfos: recipientInfos(recipient, encKey),
		EncryptedContentInfo: encryptedContentInfo{
			ContentType:                oidData,
			ContentEncryptionAlgorithm: pkix.AlgorithmIdentifier{Algorithm: oid, Parameters: asn1.RawValue{FullBytes: ivParam}},
			EncryptedContent:           sealed,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// cbcSeal encrypts plain (a whole number of blocks, no padding added) with
// AES-CBC under key and iv.
func cbcSeal(t *testing.T, key, iv, plain []byte) []byte {
	t.Helper()
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, len(plain))
	cipher.NewCBCEncrypter(block, iv).CryptBlocks(out, plain)
	return out
}

// TestDecryptionFailuresAnswerAlike: whatever goes wrong inside an
// encrypted message — the content key, its size, the padding (including a
// pad length beyond the content, which crashed a reader), the length, the
// GCM tag, or the decrypted content itself — the failure the partner is
// told is one and the same, and names no library; the detail is kept for
// the log.
func TestDecryptionFailuresAnswerAlike(t *testing.T) {
	ag := Partner{Sign: crypto.SHA256, Encrypt: EncryptAES256CBC, MDN: MDNSync}
	idem, partner, _, them := pair(t, ag)
	out, err := idem.Pack(idem.Partners["PARTNER"], "captured@idem", "application/edi-x12", []byte(interchange), testDate)
	if err != nil {
		t.Fatal(err)
	}
	key := bytes.Repeat([]byte{7}, 32)
	iv := bytes.Repeat([]byte{9}, 16)
	block := func(last byte) []byte { b := bytes.Repeat([]byte{'a'}, 16); b[15] = last; return b }
	impostor, _, _, _ := pair(t, ag) // same issuer and serial, another key
	toImpostor, _ := encrypt([]byte("x"), impostor.Certificate, EncryptAES256CBC)
	gcm, _ := encrypt(entity("application/edi-x12", []byte(interchange)), them.cert, EncryptAES256GCM)
	gcm[len(gcm)-1] ^= 1
	bodies := map[string][]byte{
		"the key of another certificate": toImpostor,
		"padding byte 0":                 envelopeCBC(t, them.cert, oidAES256CBC, key, iv, cbcSeal(t, key, iv, block(0))),
		"padding beyond the block":       envelopeCBC(t, them.cert, oidAES256CBC, key, iv, cbcSeal(t, key, iv, block(0xff))),
		"padding beyond the content":     envelopeCBC(t, them.cert, oidAES256CBC, key, iv, cbcSeal(t, key, iv, append(block('a'), block(32)...))),
		"inconsistent padding":           envelopeCBC(t, them.cert, oidAES256CBC, key, iv, cbcSeal(t, key, iv, append(bytes.Repeat([]byte{3}, 14), 2, 3))),
		"a content key of 5 bytes":       envelopeCBC(t, them.cert, oidAES256CBC, key[:5], iv, cbcSeal(t, key, iv, block(1))),
		"not whole blocks":               envelopeCBC(t, them.cert, oidAES256CBC, key, iv, cbcSeal(t, key, iv, block(1))[:15]),
		"an IV of 3 bytes":               envelopeCBC(t, them.cert, oidAES256CBC, key, iv[:3], cbcSeal(t, key, iv, block(1))),
		"valid padding, junk inside":     envelopeCBC(t, them.cert, oidAES256CBC, key, iv, cbcSeal(t, key, iv, block(1))),
		"a GCM tag that fails":           gcm,
		"no CMS at all":                  []byte("junk"),
	}
	tampered := append([]byte(nil), out.Body...)
	tampered[len(tampered)-20] ^= 0x55 // the last block of a genuine message
	bodies["a genuine message's last block changed"] = tampered
	var texts []string
	for name, body := range bodies {
		var in *Incoming
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("%s: panic %v", name, p)
				}
			}()
			in, err = partner.Unpack(out.Header, body)
		}()
		var f *Failure
		if !errors.As(err, &f) || f.Modifier != DecryptionFailed {
			t.Errorf("%s: %v, want %s", name, err, DecryptionFailed)
			continue
		}
		if in.Authenticated {
			t.Errorf("%s: authenticated", name)
		}
		texts = append(texts, f.Text())
		if f.Err == nil {
			t.Errorf("%s: no detail for the log", name)
		}
	}
	for _, s := range texts {
		if s != texts[0] {
			t.Fatalf("two answers to decryption failures: %q and %q", texts[0], s)
		}
	}
	for _, lib := range []string{"crypto", "pkcs7", "padding", "rsa", "aes", "cipher", "asn1", "key size"} {
		if strings.Contains(strings.ToLower(texts[0]), lib) {
			t.Fatalf("the answer %q names %q", texts[0], lib)
		}
	}
}

// deepBER is what overflowed the stack of a BER reader: 0x30 0x80 (a
// SEQUENCE of indefinite length) n times.
func deepBER(n int) []byte { return bytes.Repeat([]byte{0x30, 0x80}, n) }

// signedWith is a multipart/signed body over payload whose signature part
// is sig, and its Content-Type.
func signedWith(payload, sig []byte) (string, []byte) {
	return `multipart/signed; protocol="application/pkcs7-signature"; micalg=sha-256; boundary="b1"`,
		multipartSigned("b1", entity("application/edi-x12", payload, "Content-Transfer-Encoding", "binary"), sig)
}

// TestDeepBERIsRefused: a signature of 4,000,000 nested indefinite-length
// SEQUENCEs (8 MB) is refused, as a message's signature and as an MDN's,
// instead of overflowing the stack and killing the process.
func TestDeepBERIsRefused(t *testing.T) {
	idem, partner, _, _ := pair(t, Partner{Sign: crypto.SHA256, MDN: MDNSync, MDNSign: crypto.SHA256})
	out, err := idem.Pack(idem.Partners["PARTNER"], "deep@idem", "application/edi-x12", []byte(interchange), testDate)
	if err != nil {
		t.Fatal(err)
	}
	ct, body := signedWith([]byte(interchange), deepBER(4_000_000))
	h := out.Header.Clone()
	h.Set("Content-Type", ct)
	var f *Failure
	if _, err := partner.Unpack(h, body); !errors.As(err, &f) || f.Modifier != AuthenticationFailed {
		t.Fatalf("a deep signature: %v", err)
	}
	mh := http.Header{}
	mh.Set("Content-Type", ct)
	if _, err := ParseMDN(mh, body, idem.Partners["PARTNER"]); err == nil {
		t.Fatal("an MDN with a deep signature parsed")
	}
	if err := verifyDetached(deepBER(100), []byte("x"), idem.Partners["PARTNER"].Certificate); err == nil {
		t.Fatal("a deep signature verified")
	}
}

// TestEveryByteFlipAnswersAlike: every single-byte change and every
// truncation of a captured message — sampled across its length, for CBC,
// GCM and 3DES — is refused with the same decryption-failed answer, or
// (a change in the CBC IV that leaves the unsigned outer MIME header still
// readable) opens to the same payload, authenticated: no change tells
// anything about the plaintext beyond that header, none alters what is
// delivered, and none crashes the reader.
func TestEveryByteFlipAnswersAlike(t *testing.T) {
	for _, enc := range []Encryption{EncryptAES256CBC, EncryptAES128GCM, EncryptDES3} {
		ag := Partner{Sign: crypto.SHA256, Encrypt: enc, MDN: MDNSync}
		idem, partner, _, _ := pair(t, ag)
		out, err := idem.Pack(idem.Partners["PARTNER"], "captured@idem", "application/edi-x12", []byte(interchange), testDate)
		if err != nil {
			t.Fatal(err)
		}
		answer := ""
		check := func(what string, body []byte) {
			var err error
			var in *Incoming
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("%v, %s: panic %v", enc, what, p)
					}
				}()
				in, err = partner.Unpack(out.Header, body)
			}()
			if err == nil {
				if !in.Authenticated || string(in.Payload) != interchange {
					t.Fatalf("%v, %s: opened to %q (authenticated %v)", enc, what, in.Payload, in.Authenticated)
				}
				return
			}
			var f *Failure
			if !errors.As(err, &f) || f.Modifier != DecryptionFailed {
				t.Fatalf("%v, %s: %v, want %s", enc, what, err, DecryptionFailed)
			}
			if answer == "" {
				answer = f.Text()
			} else if f.Text() != answer {
				t.Fatalf("%v, %s: answered %q, another change %q", enc, what, f.Text(), answer)
			}
		}
		step := max(1, len(out.Body)/400)
		for i := 0; i < len(out.Body); i += step {
			flipped := append([]byte(nil), out.Body...)
			flipped[i] ^= 0x5a
			check(fmt.Sprintf("byte %d changed", i), flipped)
			check(fmt.Sprintf("cut at %d", i), out.Body[:i])
		}
	}
}
