package as2

import (
	"bytes"
	"crypto"
	"net/http"
	"testing"
	"time"
)

// FuzzUnpack feeds arbitrary bodies and content types to the receiver: it
// returns a message or a Failure, never panics, and an error MDN can always
// be built for what it read.
func FuzzUnpack(f *testing.F) {
	idem, partner, _, _ := pair(f, Partner{Sign: crypto.SHA256, Encrypt: EncryptAES128CBC, MDN: MDNSync, MDNSign: crypto.SHA256})
	out, err := idem.Pack(idem.Partners["PARTNER"], "fuzz@idem", "application/edi-x12", []byte(interchange), "Mon, 30 Nov 2026 08:00:00 GMT")
	if err != nil {
		f.Fatal(err)
	}
	signedOnly, _, _, _ := pair(f, Partner{Sign: crypto.SHA256, MDN: MDNSync})
	so, _ := signedOnly.Pack(signedOnly.Partners["PARTNER"], "fuzz2@idem", "application/edi-x12", []byte(interchange), "Mon, 30 Nov 2026 08:00:00 GMT")
	f.Add(out.Header.Get("Content-Type"), "binary", out.Body)
	f.Add(so.Header.Get("Content-Type"), "", so.Body)
	f.Add(`multipart/signed; boundary="b"`, "", []byte("--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b\r\n\r\n--b--"))
	f.Add("application/pkcs7-mime", "base64", []byte("MIAGCSqGSIb3DQEHA6CAMIACAQA="))
	// What overflowed the stack of the CMS library's BER reader: a
	// signature of 4,000,000 nested indefinite-length SEQUENCEs, and the
	// same as an encrypted body.
	deepCT, deepBody := signedWith([]byte(interchange), deepBER(4_000_000))
	f.Add(deepCT, "", deepBody)
	f.Add("application/pkcs7-mime", "binary", deepBER(4_000_000))
	f.Fuzz(func(t *testing.T, contentType, transfer string, body []byte) {
		h := out.Header.Clone()
		h.Set("Content-Type", contentType)
		h.Set("Content-Transfer-Encoding", transfer)
		in, err := partner.Unpack(h, body)
		var fail *Failure
		if err != nil {
			if f, ok := err.(*Failure); ok {
				fail = f
			} else {
				t.Fatalf("an error that is not a Failure: %v", err)
			}
		}
		if _, _, err := partner.BuildMDN(in, fail, time.Unix(0, 0)); err != nil {
			t.Fatalf("no MDN for %v: %v", fail, err)
		}
	})
}

// FuzzParseMDN: arbitrary MDN bodies are parsed or refused, never a panic
// and never a crash (a signed MDN's signature goes through the same bounded
// BER reader as a message's).
func FuzzParseMDN(f *testing.F) {
	idem, partner, _, _ := pair(f, Partner{Sign: crypto.SHA256, MDN: MDNSync, MDNSign: crypto.SHA256})
	out, _ := idem.Pack(idem.Partners["PARTNER"], "fuzz@idem", "application/edi-x12", []byte(interchange), "Mon, 30 Nov 2026 08:00:00 GMT")
	in, err := partner.Unpack(out.Header, out.Body)
	if err != nil {
		f.Fatal(err)
	}
	h, body, _ := partner.BuildMDN(in, nil, time.Unix(0, 0))
	f.Add(h.Get("Content-Type"), body)
	unsigned := *in
	unsigned.MDNSign = 0
	h2, body2, _ := partner.BuildMDN(&unsigned, nil, time.Unix(0, 0))
	f.Add(h2.Get("Content-Type"), body2)
	deepCT, deepBody := signedWith(body2, deepBER(4_000_000))
	f.Add(deepCT, deepBody)
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		hh := http.Header{}
		hh.Set("Content-Type", contentType)
		if m, err := ParseMDN(hh, body, idem.Partners["PARTNER"]); err == nil && m.Disposition == "" {
			t.Fatal("an MDN without a disposition was accepted")
		}
	})
}

// FuzzBERToDER: any input converts or is refused, never a panic; DER (as
// encoding/asn1 writes it) comes back unchanged.
func FuzzBERToDER(f *testing.F) {
	_, _, _, them := pair(f, Partner{})
	for _, alg := range []Encryption{EncryptAES128CBC, EncryptAES256GCM} {
		der, err := encrypt([]byte(interchange), them.cert, alg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(der)
	}
	f.Add([]byte{0x30, 0x80, 0x04, 0x02, 'h', 'i', 0x00, 0x00})
	f.Add([]byte{0x24, 0x80, 0x04, 0x01, 'a', 0x04, 0x01, 'b', 0x00, 0x00})
	f.Add(deepBER(4_000_000))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := berToDER(b)
		if err != nil {
			return
		}
		again, err := berToDER(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("converting the output again changed it: %x → %x (%v)", out, again, err)
		}
	})
}
