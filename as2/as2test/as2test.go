// Package as2test makes the certificates and profile files AS2 tests need:
// self-signed RSA certificates written as PEM files, and profile YAML.
package as2test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Party is a certificate and its key, also written as PEM files (the key
// as PKCS#8).
type Party struct {
	Cert              *x509.Certificate
	Key               *rsa.PrivateKey
	CertPath, KeyPath string
}

// NewParty makes a self-signed 2048-bit RSA certificate valid from an hour
// ago for a day, with the given serial number, and writes NAME.pem and
// NAME.key in dir. Every party shares one subject (and so one issuer
// name), so two parties with the same serial look alike but for their keys.
func NewParty(t testing.TB, dir, name string, serial int64) *Party {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "AS2 test CA", Organization: []string{"idem tests"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageDataEncipherment,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &Party{Cert: cert, Key: key, CertPath: filepath.Join(dir, name+".pem"), KeyPath: filepath.Join(dir, name+".key")}
	WritePEM(t, p.CertPath, "CERTIFICATE", der)
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	WritePEM(t, p.KeyPath, "PRIVATE KEY", pk)
	return p
}

// WritePEM writes one PEM block to path.
func WritePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
