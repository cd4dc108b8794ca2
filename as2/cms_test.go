package as2

import (
	"bytes"
	"crypto"
	"crypto/rsa"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgo/idem/as2/as2test"
	"github.com/idemgo/idem/internal/testenv"
)

// party is a test certificate and key, also written as PEM files for
// OpenSSL.
type party struct {
	cert              *x509.Certificate
	key               *rsa.PrivateKey
	certPath, keyPath string
}

func newParty(t testing.TB, dir, name string, serial int64) *party {
	p := as2test.NewParty(t, dir, name, serial)
	return &party{cert: p.Cert, key: p.Key, certPath: p.CertPath, keyPath: p.KeyPath}
}

func writePEM(t testing.TB, path, typ string, der []byte) { as2test.WritePEM(t, path, typ, der) }

// openssl runs the openssl command with args, feeding stdin, and returns
// its output.
func openssl(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	_, err := exec.LookPath("openssl")
	testenv.Need(t, "openssl (the interoperability tests' independent CMS implementation)", "PATH", err)
	cmd := exec.Command("openssl", args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("openssl %s: %v: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.Bytes()
}

const interchange = "ISA*00*          *00*          *ZZ*SENDERID       *ZZ*RECEIVERID     *260514*1032*^*00501*000000905*0*T*:~\r\n" +
	"GS*PO*SENDERID*RECEIVERID*20260514*1032*905*X*005010~ST*850*0001~BEG*00*SA*ORD-1**20260514~SE*3*0001~GE*1*905~IEA*1*000000905~\r\n"

func TestEncryptionOpenSSLDecrypts(t *testing.T) {
	dir := t.TempDir()
	partner := newParty(t, dir, "partner", 7)
	for _, alg := range []Encryption{EncryptDES3, EncryptAES128CBC, EncryptAES192CBC, EncryptAES256CBC, EncryptAES128GCM, EncryptAES256GCM} {
		der, err := encrypt([]byte(interchange), partner.cert, alg)
		if err != nil {
			t.Fatal(alg, err)
		}
		got := openssl(t, der, "cms", "-decrypt", "-inform", "DER", "-binary", "-recip", partner.certPath, "-inkey", partner.keyPath)
		if string(got) != interchange {
			t.Fatalf("%v: OpenSSL decrypted %q", alg, got)
		}
		if alg == EncryptAES128GCM || alg == EncryptAES256GCM {
			bad := append([]byte(nil), der...)
			bad[len(bad)-1] ^= 1 // the tag
			if _, err := decrypt(bad, partner.cert, partner.key); err == nil {
				t.Fatalf("%v: a message with a broken tag decrypted", alg)
			}
		}
		back, err := decrypt(der, partner.cert, partner.key)
		if err != nil || string(back) != interchange {
			t.Fatalf("%v: our decrypt: %q, %v", alg, back, err)
		}
	}
}

// TestDecryptWhatOpenSSLSends: key transport by RSA PKCS#1 v1.5 and by
// RSAES-OAEP with SHA-1, SHA-256 and SHA-512 (other AS2 products default to
// OAEP with SHA-512), streamed BER with indefinite lengths as well as DER.
func TestDecryptWhatOpenSSLSends(t *testing.T) {
	dir := t.TempDir()
	us := newParty(t, dir, "us", 9)
	for _, c := range []struct {
		name string
		args []string
	}{
		{"aes256-cbc pkcs1v15 DER", []string{"-aes256"}},
		{"des3 pkcs1v15 DER", []string{"-des3"}},
		{"aes192-cbc oaep sha256", []string{"-aes192", "-keyopt", "rsa_padding_mode:oaep", "-keyopt", "rsa_oaep_md:sha256"}},
		{"aes128-cbc oaep sha1", []string{"-aes128", "-keyopt", "rsa_padding_mode:oaep"}},
		{"aes256-cbc oaep sha256", []string{"-aes256", "-keyopt", "rsa_padding_mode:oaep", "-keyopt", "rsa_oaep_md:sha256"}},
		{"aes256-cbc oaep sha512", []string{"-aes256", "-keyopt", "rsa_padding_mode:oaep", "-keyopt", "rsa_oaep_md:sha512", "-keyopt", "rsa_mgf1_md:sha512"}},
		{"aes256-cbc BER indefinite", []string{"-aes256", "-stream", "-indef"}},
		{"aes128-gcm pkcs1v15", []string{"-aes-128-gcm"}},
		{"aes256-gcm BER indefinite", []string{"-aes-256-gcm", "-stream", "-indef"}},
		{"aes192-cbc BER indefinite", []string{"-aes192", "-stream", "-indef"}},
		{"aes256-gcm oaep sha256", []string{"-aes-256-gcm", "-keyopt", "rsa_padding_mode:oaep", "-keyopt", "rsa_oaep_md:sha256"}},
		{"aes256-gcm oaep sha512", []string{"-aes-256-gcm", "-keyopt", "rsa_padding_mode:oaep", "-keyopt", "rsa_oaep_md:sha512", "-keyopt", "rsa_mgf1_md:sha512"}},
	} {
		args := append([]string{"cms", "-encrypt", "-binary", "-outform", "DER", "-recip", us.certPath}, c.args...)
		der := openssl(t, []byte(interchange), args...)
		got, err := decrypt(der, us.cert, us.key)
		if err != nil || string(got) != interchange {
			t.Errorf("%s: %q, %v", c.name, got, err)
		}
	}
}

func TestSignaturesBothWays(t *testing.T) {
	dir := t.TempDir()
	us := newParty(t, dir, "us", 11)
	content := []byte("Content-Type: application/edi-x12\r\n\r\n" + interchange)
	contentPath := filepath.Join(dir, "content")
	if err := os.WriteFile(contentPath, content, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, h := range []crypto.Hash{crypto.SHA1, crypto.SHA256, crypto.SHA384, crypto.SHA512} {
		sig, err := signDetached(content, us.cert, us.key, h)
		if err != nil {
			t.Fatal(h, err)
		}
		openssl(t, sig, "cms", "-verify", "-binary", "-inform", "DER", "-content", contentPath, "-CAfile", us.certPath, "-purpose", "any", "-out", os.DevNull)
		if err := verifyDetached(sig, content, us.cert); err != nil {
			t.Fatalf("%v: our own signature: %v", h, err)
		}
		if err := verifyDetached(sig, append([]byte("X"), content...), us.cert); err == nil {
			t.Fatalf("%v: a signature verified over other content", h)
		}
	}
	// OpenSSL's signature, DER and streamed BER, verifies; an impostor
	// certificate with the same issuer and serial number but another key
	// does not.
	for _, extra := range [][]string{nil, {"-stream", "-indef"}} {
		args := append([]string{"cms", "-sign", "-binary", "-outform", "DER", "-md", "sha256", "-signer", us.certPath, "-inkey", us.keyPath, "-in", contentPath}, extra...)
		sig := openssl(t, nil, args...)
		if err := verifyDetached(sig, content, us.cert); err != nil {
			t.Fatalf("OpenSSL's signature %v: %v", extra, err)
		}
		impostor := newParty(t, t.TempDir(), "impostor", 11)
		if err := verifyDetached(sig, content, impostor.cert); err == nil {
			t.Fatal("a signature verified against a certificate that only shares issuer and serial")
		}
	}
}

func TestBERToDERKeepsDER(t *testing.T) {
	them := newParty(t, t.TempDir(), "them", 5)
	for _, alg := range []Encryption{EncryptAES128CBC, EncryptAES256GCM} {
		der, err := encrypt([]byte(interchange), them.cert, alg)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := berToDER(der); err != nil || !bytes.Equal(out, der) {
			t.Fatalf("%v: DER changed by the BER conversion (%v)", alg, err)
		}
	}
	// Indefinite lengths and a constructed string become definite.
	out, err := berToDER([]byte{0x30, 0x80, 0x24, 0x80, 0x04, 0x01, 'a', 0x04, 0x01, 'b', 0x00, 0x00, 0x00, 0x00})
	if err != nil || !bytes.Equal(out, []byte{0x30, 0x08, 0x24, 0x06, 0x04, 0x01, 'a', 0x04, 0x01, 'b'}) {
		t.Fatalf("%x, %v", out, err)
	}
	if joined, err := joinOctets(out[4:], true); err != nil || string(joined) != "ab" {
		t.Fatalf("joined %q, %v", joined, err)
	}
}
