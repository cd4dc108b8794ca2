package as2

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadProfile(t *testing.T) {
	dir := t.TempDir()
	newParty(t, dir, "idem", 1)
	newParty(t, dir, "partner", 2)
	newParty(t, dir, "other", 3)
	// An expired certificate.
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(4), Subject: pkix.Name{CommonName: "old"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	writePEM(t, filepath.Join(dir, "expired.pem"), "CERTIFICATE", der)

	good := `as2_id: IDEMCO
certificate: idem.pem
private_key: idem.key
mdn_url: http://127.0.0.1:8080/as2/mdn
partners:
  - as2_id: PARTNER
    url: https://partner.example/as2
    certificate: partner.pem
    sign: sha256
    encrypt: aes256-cbc
    mdn: async
    mdn_sign: sha-256
    edi_senders: [BUYER, "ZZ:BUYER2"]
    async_mdn_urls: [https://partner.example/as2/mdn]
`
	write := func(body string) string {
		path := filepath.Join(dir, "as2.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p, err := LoadProfile(write(good), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pt := p.Partners["PARTNER"]
	if p.AS2ID != "IDEMCO" || pt == nil || pt.Sign != crypto.SHA256 || pt.Encrypt != EncryptAES256CBC || pt.MDN != MDNAsync || pt.MDNSign != crypto.SHA256 {
		t.Fatalf("loaded %+v, partner %+v", p, pt)
	}
	for _, c := range []struct {
		qual, id string
		want     bool
	}{{"ZZ", "BUYER", true}, {"01", "BUYER", true}, {"ZZ", "BUYER2", true}, {"01", "BUYER2", false}, {"ZZ", "OTHER", false}} {
		if got := pt.AllowsEDISender(c.qual, c.id); got != c.want {
			t.Errorf("sender %s:%s allowed %v, want %v", c.qual, c.id, got, c.want)
		}
	}
	if !pt.AllowsAsyncMDNURL("https://partner.example/as2/mdn") || pt.AllowsAsyncMDNURL("http://127.0.0.1:29555/internal/admin") {
		t.Error("async_mdn_urls not applied")
	}
	// Each refusal names its field.
	for field, change := range map[string][2]string{
		"colour":                  {"sign: sha256\n", "sign: sha256\n    colour: blue\n"},
		"private_key":             {"private_key: idem.key", "private_key: other.key"},
		"partners[0].certificate": {"certificate: partner.pem", "certificate: expired.pem"},
		"partners[0].encrypt":     {"encrypt: aes256-cbc", "encrypt: rc2"},
		"partners[0].sign":        {"sign: sha256", "sign: md5"},
		"partners[0].mdn":         {"mdn: async", "mdn: sometimes"},
		"private_key: open":       {"private_key: idem.key", "private_key: missing.key"},
		"async needs mdn_url":     {"mdn_url: http://127.0.0.1:8080/as2/mdn\n", ""},
		"edi_senders[1]":          {`"ZZ:BUYER2"`, `"ZZ:"`},
		"async_mdn_urls[0]":       {"[https://partner.example/as2/mdn]", "[file:///etc/passwd]"},
	} {
		_, err := LoadProfile(write(strings.Replace(good, change[0], change[1], 1)), time.Now())
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v does not name the field", field, err)
		}
	}
}
