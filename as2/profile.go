package as2

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Profile is who we are in AS2 and who our partners are: the parsed and
// checked form of an as2 profile file (see LoadProfile).
type Profile struct {
	// AS2ID is our AS2 name (AS2-From on what we send).
	AS2ID string
	// Certificate and Key sign what we send and decrypt what we receive.
	Certificate *x509.Certificate
	Key         crypto.Signer
	// MDNURL, if set, is where partners send asynchronous MDNs.
	MDNURL string
	// Partners by AS2 name.
	Partners map[string]*Partner
}

// Partner is one trading partner's agreement.
type Partner struct {
	AS2ID string
	// URL is where we post to the partner.
	URL string
	// Certificate verifies the partner's signatures and encrypts to it.
	Certificate *x509.Certificate
	// Sign is the digest of our signature (0: unsigned).
	Sign crypto.Hash
	// Encrypt is the content encryption (EncryptNone: unencrypted).
	Encrypt Encryption
	// MDN is the receipt we ask for: MDNNone, MDNSync or MDNAsync.
	MDN string
	// MDNSign is the MIC algorithm of the signed MDN we ask for (0: an
	// unsigned MDN). It is also the partner's MDN policy for us: where it
	// is set, an MDN from the partner changes an outbox row only when
	// signed by the partner's certificate.
	MDNSign crypto.Hash
	// EDISenders are the interchange sender ids this partner may send: an
	// entry "ID" allows ID under any qualifier, "QUALIFIER:ID" (split at
	// the first colon) only under that qualifier (UNB S002 0004 and 0007;
	// ISA06 and ISA05). An interchange from any other sender id is refused,
	// so one partner can never use, and so block, another's control
	// numbers; so is EDI that does not read cleanly, and with no
	// EDISenders, all EDI. The X12 application sender (GS02) and
	// EDIFACT's UNG sender are not bound here: they name an application
	// of the partner's, agreed per trading relationship and often unlike
	// the interchange sender id, and key nothing idem deduplicates; the
	// application that processes a group checks them against its own
	// agreement.
	EDISenders []string
	// AsyncMDNURLs are the addresses an asynchronous MDN to this partner
	// may be sent to (exact matches). A Receipt-Delivery-Option outside
	// them is not followed: the MDN is answered synchronously instead.
	AsyncMDNURLs []string
}

// AllowsEDISender reports whether the agreement lists the interchange
// sender id under qualifier.
func (pt *Partner) AllowsEDISender(qualifier, id string) bool {
	for _, s := range pt.EDISenders {
		q, i, qualified := strings.Cut(s, ":")
		if !qualified && s == id || qualified && q == qualifier && i == id {
			return true
		}
	}
	return false
}

// AllowsAsyncMDNURL reports whether an asynchronous MDN may be sent to u.
func (pt *Partner) AllowsAsyncMDNURL(u string) bool {
	for _, a := range pt.AsyncMDNURLs {
		if a == u {
			return true
		}
	}
	return false
}

// The receipts a partner may be asked for.
const (
	MDNNone  = "none"
	MDNSync  = "sync"
	MDNAsync = "async"
)

// profileFile is the YAML of a profile; paths are relative to the file.
type profileFile struct {
	AS2ID       string        `yaml:"as2_id"`
	Certificate string        `yaml:"certificate"`
	PrivateKey  string        `yaml:"private_key"`
	MDNURL      string        `yaml:"mdn_url"`
	Partners    []partnerFile `yaml:"partners"`
}

type partnerFile struct {
	AS2ID       string   `yaml:"as2_id"`
	URL         string   `yaml:"url"`
	Certificate string   `yaml:"certificate"`
	Sign        string   `yaml:"sign"`
	Encrypt     string   `yaml:"encrypt"`
	MDN         string   `yaml:"mdn"`
	MDNSign     string   `yaml:"mdn_sign"`
	EDISenders  []string `yaml:"edi_senders"`
	AsyncMDNURL []string `yaml:"async_mdn_urls"`
}

// LoadProfile reads and checks a profile file:
//
//	as2_id: IDEMCO
//	certificate: idem.pem          # ours, PEM
//	private_key: idem.key          # ours, PEM (PKCS#8 or PKCS#1)
//	mdn_url: http://host:port/as2/mdn   # optional
//	partners:
//	  - as2_id: PARTNER
//	    url: https://partner.example/as2
//	    certificate: partner.pem
//	    sign: sha256                # none | sha1 | sha256 | sha384 | sha512
//	    encrypt: aes256-cbc         # none | des3 | aes128-cbc | aes192-cbc | aes256-cbc | aes128-gcm | aes256-gcm
//	    mdn: sync                   # none | sync | async
//	    mdn_sign: sha256            # none, or the MIC algorithm of the signed MDN to request
//	    edi_senders: [BUYER, "ZZ:BUYER2"]   # the interchange sender ids the partner may use
//	    async_mdn_urls: [https://partner.example/as2/mdn]   # where its asynchronous MDNs may go
//
// A bad file — an unknown field, a missing or unreadable key or
// certificate, a key that does not match its certificate, a certificate
// outside its validity at now, an unknown algorithm, a duplicate partner —
// is refused with an error naming the field.
func LoadProfile(path string, now time.Time) (*Profile, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("as2 profile: %w", err)
	}
	var f profileFile
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("as2 profile %s: %w", path, err)
	}
	p, err := f.check(filepath.Dir(path), now)
	if err != nil {
		return nil, fmt.Errorf("as2 profile %s: %w", path, err)
	}
	return p, nil
}

func (f *profileFile) check(dir string, now time.Time) (*Profile, error) {
	if err := checkName(f.AS2ID); err != nil {
		return nil, fmt.Errorf("as2_id: %w", err)
	}
	p := &Profile{AS2ID: f.AS2ID, MDNURL: f.MDNURL, Partners: map[string]*Partner{}}
	var err error
	if p.Certificate, err = loadCertificate(dir, f.Certificate, now); err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	if p.Key, err = loadKey(dir, f.PrivateKey); err != nil {
		return nil, fmt.Errorf("private_key: %w", err)
	}
	if !publicKeysEqual(p.Key.Public(), p.Certificate.PublicKey) {
		return nil, errors.New("private_key: does not match certificate")
	}
	if f.MDNURL != "" {
		if u, err := url.Parse(f.MDNURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("mdn_url %q: want an http(s) URL", f.MDNURL)
		}
	}
	for n, pf := range f.Partners {
		field := fmt.Sprintf("partners[%d]", n)
		pt, err := pf.check(dir, now)
		if err != nil {
			return nil, fmt.Errorf("%s.%w", field, err)
		}
		if _, dup := p.Partners[pt.AS2ID]; dup {
			return nil, fmt.Errorf("%s.as2_id: %q is listed twice", field, pt.AS2ID)
		}
		if pt.MDN == MDNAsync && p.MDNURL == "" {
			return nil, fmt.Errorf("%s.mdn: async needs mdn_url (where the partner sends it)", field)
		}
		p.Partners[pt.AS2ID] = pt
	}
	return p, nil
}

func (pf *partnerFile) check(dir string, now time.Time) (*Partner, error) {
	if err := checkName(pf.AS2ID); err != nil {
		return nil, fmt.Errorf("as2_id: %w", err)
	}
	pt := &Partner{AS2ID: pf.AS2ID, URL: pf.URL}
	if pf.URL != "" {
		if u, err := url.Parse(pf.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("url %q: want an http(s) URL", pf.URL)
		}
	}
	var err error
	if pt.Certificate, err = loadCertificate(dir, pf.Certificate, now); err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	if pt.Sign, err = parseHash(pf.Sign); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	if pt.Encrypt, err = ParseEncryption(pf.Encrypt); err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	switch pf.MDN {
	case "", MDNNone:
		pt.MDN = MDNNone
	case MDNSync, MDNAsync:
		pt.MDN = pf.MDN
	default:
		return nil, fmt.Errorf("mdn: %q is not none, sync or async", pf.MDN)
	}
	if pt.MDNSign, err = parseHash(pf.MDNSign); err != nil {
		return nil, fmt.Errorf("mdn_sign: %w", err)
	}
	for i, s := range pf.EDISenders {
		if strings.TrimSpace(s) != s || s == "" || strings.HasPrefix(s, ":") || strings.HasSuffix(s, ":") {
			return nil, fmt.Errorf("edi_senders[%d]: %q: want ID or QUALIFIER:ID", i, s)
		}
	}
	pt.EDISenders = pf.EDISenders
	for i, a := range pf.AsyncMDNURL {
		if u, err := url.Parse(a); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("async_mdn_urls[%d] %q: want an http(s) URL", i, a)
		}
	}
	pt.AsyncMDNURLs = pf.AsyncMDNURL
	return pt, nil
}

// checkName checks an AS2 name: 1 to 128 printable ASCII characters
// (RFC 4130 §6.2; quoted on the wire when it holds spaces).
func checkName(s string) error {
	if s == "" || len(s) > 128 {
		return fmt.Errorf("%q: want 1 to 128 characters", s)
	}
	for _, c := range []byte(s) {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return fmt.Errorf("%q: only printable ASCII without quotes or backslashes", s)
		}
	}
	return nil
}

func resolve(dir, path string) string {
	if filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(dir, path)
}

func loadCertificate(dir, path string, now time.Time) (*x509.Certificate, error) {
	if path == "" {
		return nil, errors.New("missing")
	}
	raw, err := os.ReadFile(resolve(dir, path))
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM CERTIFICATE block", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return nil, fmt.Errorf("%s: valid from %s to %s, not now (%s)", path, cert.NotBefore.Format(time.RFC3339), cert.NotAfter.Format(time.RFC3339), now.Format(time.RFC3339))
	}
	if _, ok := cert.PublicKey.(*rsa.PublicKey); !ok {
		return nil, fmt.Errorf("%s: a %T key; AS2 partners use RSA", path, cert.PublicKey)
	}
	return cert, nil
}

func loadKey(dir, path string) (crypto.Signer, error) {
	if path == "" {
		return nil, errors.New("missing")
	}
	raw, err := os.ReadFile(resolve(dir, path))
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	switch block.Type {
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(block.Bytes)
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%s: a %T key; AS2 uses RSA", path, k)
		}
		return rk, nil
	}
	return nil, fmt.Errorf("%s: a PEM %q block; want PRIVATE KEY (PKCS#8) or RSA PRIVATE KEY (PKCS#1)", path, block.Type)
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	switch k := a.(type) {
	case *rsa.PublicKey:
		return k.Equal(b)
	case *ecdsa.PublicKey:
		return k.Equal(b)
	case ed25519.PublicKey:
		return k.Equal(b)
	}
	return false
}

// parseHash reads a digest name: none (or empty), sha1, sha256, sha384,
// sha512, and the sha-256 spellings (RFC 5751 micalg names).
func parseHash(s string) (crypto.Hash, error) {
	switch strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "") {
	case "", "none":
		return 0, nil
	case "sha1":
		return crypto.SHA1, nil
	case "sha256":
		return crypto.SHA256, nil
	case "sha384":
		return crypto.SHA384, nil
	case "sha512":
		return crypto.SHA512, nil
	}
	return 0, fmt.Errorf("%q is not none, sha1, sha256, sha384 or sha512", s)
}

// micalgName is the RFC 5751 micalg name of h (sha-256, …).
func micalgName(h crypto.Hash) string {
	switch h {
	case crypto.SHA1:
		return "sha-1"
	case crypto.SHA256:
		return "sha-256"
	case crypto.SHA384:
		return "sha-384"
	case crypto.SHA512:
		return "sha-512"
	}
	return ""
}
