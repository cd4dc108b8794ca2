package as2

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/des"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/smallstep/pkcs7"
)

// Encryption is a content encryption algorithm of an AS2 agreement.
type Encryption int

// The content encryptions.
const (
	EncryptNone Encryption = iota
	EncryptDES3
	EncryptAES128CBC
	EncryptAES192CBC
	EncryptAES256CBC
	EncryptAES128GCM
	EncryptAES256GCM
)

var encryptionNames = map[Encryption]string{
	EncryptNone: "none", EncryptDES3: "des3", EncryptAES128CBC: "aes128-cbc",
	EncryptAES192CBC: "aes192-cbc", EncryptAES256CBC: "aes256-cbc",
	EncryptAES128GCM: "aes128-gcm", EncryptAES256GCM: "aes256-gcm",
}

func (e Encryption) String() string { return encryptionNames[e] }

// ParseEncryption reads an encryption name: none (or empty), des3,
// aes128-cbc, aes192-cbc, aes256-cbc, aes128-gcm, aes256-gcm (CMS
// AuthEnvelopedData).
func ParseEncryption(s string) (Encryption, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	if name == "" {
		return EncryptNone, nil
	}
	for e, n := range encryptionNames {
		if n == name {
			return e, nil
		}
	}
	return 0, fmt.Errorf("%q is not none, des3, aes128-cbc, aes192-cbc, aes256-cbc, aes128-gcm or aes256-gcm", s)
}

var (
	oidData            = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 7, 1}
	oidEnvelopedData   = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 7, 3}
	oidRSAEncryption   = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 1}
	oidDESEDE3CBC      = asn1.ObjectIdentifier{1, 2, 840, 113549, 3, 7}
	oidAES128CBC       = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 2}
	oidAES192CBC       = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 22}
	oidAES256CBC       = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 42}
	oidDigestSHA1      = asn1.ObjectIdentifier{1, 3, 14, 3, 2, 26}
	oidDigestSHA256    = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 1}
	oidDigestSHA384    = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 2}
	oidDigestSHA512    = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 3}
	errUnsupportedHash = errors.New("as2: unsupported digest")
)

func digestOID(h crypto.Hash) (asn1.ObjectIdentifier, error) {
	switch h {
	case crypto.SHA1:
		return oidDigestSHA1, nil
	case crypto.SHA256:
		return oidDigestSHA256, nil
	case crypto.SHA384:
		return oidDigestSHA384, nil
	case crypto.SHA512:
		return oidDigestSHA512, nil
	}
	return nil, errUnsupportedHash
}

// signDetached returns the DER of a detached CMS SignedData over content,
// signed by cert and key with digest h (the certificate included).
func signDetached(content []byte, cert *x509.Certificate, key crypto.Signer, h crypto.Hash) ([]byte, error) {
	oid, err := digestOID(h)
	if err != nil {
		return nil, err
	}
	sd, err := pkcs7.NewSignedData(content)
	if err != nil {
		return nil, err
	}
	sd.SetDigestAlgorithm(oid)
	if err := sd.AddSigner(cert, key, pkcs7.SignerInfoConfig{}); err != nil {
		return nil, fmt.Errorf("as2: sign: %w", err)
	}
	sd.Detach()
	return sd.Finish()
}

// verifyDetached checks a detached CMS signature (DER or BER) over content
// against the partner's certificate itself: a certificate carried in the
// message, even one with the same issuer and serial number, is not trusted.
// The signature is re-encoded first (berToDER, nesting bounded), so no
// input reaches the CMS library's recursive reader deeper than that bound.
func verifyDetached(signature, content []byte, partner *x509.Certificate) error {
	der, _, err := berElement(signature, 0)
	if err != nil {
		return fmt.Errorf("as2: the signature is not CMS SignedData: %w", err)
	}
	p7, err := pkcs7.Parse(der)
	if err != nil {
		return fmt.Errorf("as2: the signature is not CMS SignedData: %w", err)
	}
	p7.Content = content
	p7.Certificates = []*x509.Certificate{partner}
	if err := p7.Verify(); err != nil {
		return fmt.Errorf("as2: the signature does not verify against %s's certificate: %w", partner.Subject.CommonName, err)
	}
	return nil
}

// decrypt opens a CMS EnvelopedData with DES-EDE3-CBC or AES-CBC, or an
// AuthEnvelopedData with AES-GCM (DER or BER; RSA PKCS#1 v1.5 or
// RSAES-OAEP key transport), addressed to cert. Its errors are details for
// the log (see Failure).
func decrypt(der []byte, cert *x509.Certificate, key crypto.Signer) ([]byte, error) {
	typ, content, err := contentInfoOf(der)
	if err != nil {
		return nil, fmt.Errorf("as2: not CMS: %w", err)
	}
	switch {
	case typ.Equal(oidAuthEnvelopedData):
		return decryptGCM(content, cert, key)
	case typ.Equal(oidEnvelopedData):
		return decryptCBC(content, cert, key)
	}
	return nil, fmt.Errorf("as2: CMS content of type %v, not enveloped data", typ)
}

// The EnvelopedData structures (RFC 5652 §6) idem writes itself: the
// library chooses its algorithm through package variables, which two
// partners' sends at once would race on.
type envelopedData struct {
	Version              int
	RecipientInfos       []keyTransRecipientInfo `asn1:"set"`
	EncryptedContentInfo encryptedContentInfo
}

type keyTransRecipientInfo struct {
	Version                int
	IssuerAndSerialNumber  issuerAndSerial
	KeyEncryptionAlgorithm pkix.AlgorithmIdentifier
	EncryptedKey           []byte
}

type issuerAndSerial struct {
	IssuerName   asn1.RawValue
	SerialNumber *big.Int
}

type encryptedContentInfo struct {
	ContentType                asn1.ObjectIdentifier
	ContentEncryptionAlgorithm pkix.AlgorithmIdentifier
	EncryptedContent           []byte `asn1:"tag:0,optional"`
}

type contentInfo struct {
	ContentType asn1.ObjectIdentifier
	Content     asn1.RawValue `asn1:"explicit,optional,tag:0"`
}

// encrypt returns the DER of a CMS EnvelopedData of content for recipient
// (RSA PKCS#1 v1.5 key transport, the one every AS2 product reads).
func encrypt(content []byte, recipient *x509.Certificate, alg Encryption) ([]byte, error) {
	var oid asn1.ObjectIdentifier
	var keyLen int
	var newBlock func([]byte) (cipher.Block, error)
	switch alg {
	case EncryptDES3:
		oid, keyLen, newBlock = oidDESEDE3CBC, 24, des.NewTripleDESCipher
	case EncryptAES128CBC:
		oid, keyLen, newBlock = oidAES128CBC, 16, aes.NewCipher
	case EncryptAES192CBC:
		oid, keyLen, newBlock = oidAES192CBC, 24, aes.NewCipher
	case EncryptAES256CBC:
		oid, keyLen, newBlock = oidAES256CBC, 32, aes.NewCipher
	case EncryptAES128GCM, EncryptAES256GCM:
		return encryptGCM(content, recipient, alg)
	default:
		return nil, fmt.Errorf("as2: cannot encrypt with %v", alg)
	}
	pub, ok := recipient.PublicKey.(*rsa.PublicKey)
	if !ok {
		return nil, errors.New("as2: the recipient's certificate has no RSA key")
	}
	key := make([]byte, keyLen)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	block, err := newBlock(key)
	if err != nil {
		return nil, err
	}
	iv := make([]byte, block.BlockSize())
	if _, err := rand.Read(iv); err != nil {
		return nil, err
	}
	// PKCS#7 padding: 1 to BlockSize bytes, each the pad length.
	pad := block.BlockSize() - len(content)%block.BlockSize()
	sealed := make([]byte, len(content)+pad)
	copy(sealed, content)
	for i := len(content); i < len(sealed); i++ {
		sealed[i] = byte(pad)
	}
	cipher.NewCBCEncrypter(block, iv).CryptBlocks(sealed, sealed)
	//lint:ignore SA1019 AS2 partners (RFC 4130, CMS key transport) expect RSA PKCS#1 v1.5; OAEP is what they must agree to first
	encKey, err := rsa.EncryptPKCS1v15(rand.Reader, pub, key)
	if err != nil {
		return nil, err
	}
	ivParam, err := asn1.Marshal(iv)
	if err != nil {
		return nil, err
	}
	ed := envelopedData{
		Version:        0,
		RecipientInfos: recipientInfos(recipient, encKey),
		EncryptedContentInfo: encryptedContentInfo{
			ContentType:                oidData,
			ContentEncryptionAlgorithm: pkix.AlgorithmIdentifier{Algorithm: oid, Parameters: asn1.RawValue{FullBytes: ivParam}},
			EncryptedContent:           sealed,
		},
	}
	return wrapContentInfo(oidEnvelopedData, ed)
}

// recipientInfos names recipient (issuer and serial number) as the one
// recipient, its content key encrypted with RSA PKCS#1 v1.5.
func recipientInfos(recipient *x509.Certificate, encKey []byte) []keyTransRecipientInfo {
	return []keyTransRecipientInfo{{
		IssuerAndSerialNumber:  issuerAndSerial{IssuerName: asn1.RawValue{FullBytes: recipient.RawIssuer}, SerialNumber: recipient.SerialNumber},
		KeyEncryptionAlgorithm: pkix.AlgorithmIdentifier{Algorithm: oidRSAEncryption, Parameters: asn1.NullRawValue},
		EncryptedKey:           encKey,
	}}
}

// wrapContentInfo returns the DER of a ContentInfo of type oid around
// content.
func wrapContentInfo(oid asn1.ObjectIdentifier, content any) ([]byte, error) {
	inner, err := asn1.Marshal(content)
	if err != nil {
		return nil, err
	}
	return asn1.Marshal(contentInfo{ContentType: oid, Content: asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: inner}})
}
