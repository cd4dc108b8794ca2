package as2

import (
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
)

// AES-GCM in CMS is AuthEnvelopedData (RFC 5083) with GCMParameters (RFC
// 5084); the library idem uses for the rest of CMS does not write or read
// it, so this file does, for RSA key transport.

var (
	oidAuthEnvelopedData = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 16, 1, 23}
	oidAES128GCM         = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 6}
	oidAES256GCM         = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 46}
	oidRSAESOAEP         = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 7}
)

type authEnvelopedData struct {
	Version                  int
	RecipientInfos           []keyTransRecipientInfo `asn1:"set"`
	AuthEncryptedContentInfo encryptedContentInfo
	AuthAttrs                asn1.RawValue `asn1:"optional,tag:1"`
	MAC                      []byte
}

type gcmParameters struct {
	Nonce  []byte
	ICVLen int `asn1:"default:12"`
}

// encryptGCM returns the DER of a CMS AuthEnvelopedData of content for
// recipient with AES-GCM (a 12-byte nonce, a 16-byte tag).
func encryptGCM(content []byte, recipient *x509.Certificate, alg Encryption) ([]byte, error) {
	oid, keyLen := oidAES128GCM, 16
	if alg == EncryptAES256GCM {
		oid, keyLen = oidAES256GCM, 32
	}
	pub, ok := recipient.PublicKey.(*rsa.PublicKey)
	if !ok {
		return nil, errors.New("as2: the recipient's certificate has no RSA key")
	}
	key := make([]byte, keyLen)
	nonce := make([]byte, 12)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCMWithTagSize(block, 16)
	if err != nil {
		return nil, err
	}
	sealed := aead.Seal(nil, nonce, content, nil)
	ciphertext, tag := sealed[:len(content)], sealed[len(content):]
	encKey, err := rsa.EncryptPKCS1v15(rand.Reader, pub, key)
	if err != nil {
		return nil, err
	}
	params, err := asn1.Marshal(gcmParameters{Nonce: nonce, ICVLen: 16})
	if err != nil {
		return nil, err
	}
	ad := authEnvelopedData{
		RecipientInfos: recipientInfos(recipient, encKey),
		AuthEncryptedContentInfo: encryptedContentInfo{
			ContentType:                oidData,
			ContentEncryptionAlgorithm: pkix.AlgorithmIdentifier{Algorithm: oid, Parameters: asn1.RawValue{FullBytes: params}},
			EncryptedContent:           ciphertext,
		},
		MAC: tag,
	}
	return wrapContentInfo(oidAuthEnvelopedData, ad)
}

// The reading forms: the encrypted content as a RawValue, primitive (DER)
// or constructed (streamed BER).
type encryptedContentInfoIn struct {
	ContentType                asn1.ObjectIdentifier
	ContentEncryptionAlgorithm pkix.AlgorithmIdentifier
	EncryptedContent           asn1.RawValue `asn1:"tag:0,optional"`
}

type envelopedDataIn struct {
	Version              int
	RecipientInfos       []keyTransRecipientInfo `asn1:"set"`
	EncryptedContentInfo encryptedContentInfoIn
}

type authEnvelopedDataIn struct {
	Version                  int
	RecipientInfos           []keyTransRecipientInfo `asn1:"set"`
	AuthEncryptedContentInfo encryptedContentInfoIn
	AuthAttrs                asn1.RawValue `asn1:"optional,tag:1"`
	MAC                      []byte
}

func (e encryptedContentInfoIn) content() ([]byte, error) {
	return joinOctets(e.EncryptedContent.Bytes, e.EncryptedContent.IsCompound)
}

// contentInfoOf reads the ContentInfo of a CMS message, DER or BER (the
// BER re-encoded), and returns its type and content.
func contentInfoOf(b []byte) (asn1.ObjectIdentifier, []byte, error) {
	var ci contentInfo
	if _, err := asn1.Unmarshal(b, &ci); err != nil {
		der, derr := berToDER(b)
		if derr != nil {
			return nil, nil, derr
		}
		if _, err := asn1.Unmarshal(der, &ci); err != nil {
			return nil, nil, err
		}
	}
	return ci.ContentType, ci.Content.Bytes, nil
}

// decryptGCM opens a DER CMS AuthEnvelopedData with AES-GCM addressed to
// cert (RSA PKCS#1 v1.5 or RSAES-OAEP key transport).
func decryptGCM(content []byte, cert *x509.Certificate, key crypto.Signer) ([]byte, error) {
	var ad authEnvelopedDataIn
	if _, err := asn1.Unmarshal(content, &ad); err != nil {
		return nil, fmt.Errorf("as2: AuthEnvelopedData: %w", err)
	}
	if len(ad.AuthAttrs.FullBytes) > 0 {
		return nil, errors.New("as2: AuthEnvelopedData with authenticated attributes is not supported")
	}
	contentKey, err := contentKeyFor(ad.RecipientInfos, cert, key)
	if err != nil {
		return nil, err
	}
	eci := ad.AuthEncryptedContentInfo
	if !eci.ContentEncryptionAlgorithm.Algorithm.Equal(oidAES128GCM) && !eci.ContentEncryptionAlgorithm.Algorithm.Equal(oidAES256GCM) {
		return nil, fmt.Errorf("as2: content encryption %v is not supported", eci.ContentEncryptionAlgorithm.Algorithm)
	}
	var params gcmParameters
	if _, err := asn1.Unmarshal(eci.ContentEncryptionAlgorithm.Parameters.FullBytes, &params); err != nil {
		return nil, fmt.Errorf("as2: GCM parameters: %w", err)
	}
	block, err := aes.NewCipher(contentKey)
	if err != nil {
		return nil, err
	}
	if params.ICVLen < 12 || params.ICVLen > 16 {
		return nil, fmt.Errorf("as2: a GCM tag of %d bytes", params.ICVLen)
	}
	var aead cipher.AEAD
	switch {
	case len(params.Nonce) == 12:
		aead, err = cipher.NewGCMWithTagSize(block, params.ICVLen)
	case params.ICVLen == 16:
		aead, err = cipher.NewGCMWithNonceSize(block, len(params.Nonce))
	default:
		err = fmt.Errorf("as2: a GCM nonce of %d bytes with a %d-byte tag is not supported", len(params.Nonce), params.ICVLen)
	}
	if err != nil {
		return nil, err
	}
	if len(ad.MAC) != params.ICVLen {
		return nil, errors.New("as2: the GCM tag length differs from its parameters")
	}
	ciphertext, err := eci.content()
	if err != nil {
		return nil, err
	}
	plain, err := aead.Open(nil, params.Nonce, append(ciphertext, ad.MAC...), nil)
	if err != nil {
		return nil, fmt.Errorf("as2: AES-GCM: %w", err)
	}
	return plain, nil
}

// contentKeyFor decrypts the content key of the recipient that is cert
// (issuer and serial number), transported with RSA PKCS#1 v1.5 or
// RSAES-OAEP.
func contentKeyFor(ris []keyTransRecipientInfo, cert *x509.Certificate, key crypto.Signer) ([]byte, error) {
	priv, ok := key.(*rsa.PrivateKey)
	if !ok {
		return nil, errors.New("as2: the private key is not RSA")
	}
	for _, ri := range ris {
		if ri.IssuerAndSerialNumber.SerialNumber == nil || ri.IssuerAndSerialNumber.SerialNumber.Cmp(cert.SerialNumber) != 0 ||
			string(ri.IssuerAndSerialNumber.IssuerName.FullBytes) != string(cert.RawIssuer) {
			continue
		}
		var contentKey []byte
		var err error
		switch alg := ri.KeyEncryptionAlgorithm; {
		case alg.Algorithm.Equal(oidRSAEncryption):
			contentKey, err = rsa.DecryptPKCS1v15(nil, priv, ri.EncryptedKey)
		case alg.Algorithm.Equal(oidRSAESOAEP):
			h, mgf, herr := oaepHashes(alg.Parameters.FullBytes)
			if herr != nil {
				return nil, herr
			}
			contentKey, err = priv.Decrypt(nil, ri.EncryptedKey, &rsa.OAEPOptions{Hash: h, MGFHash: mgf})
		default:
			return nil, fmt.Errorf("as2: key transport %v is not supported", alg.Algorithm)
		}
		if err != nil {
			return nil, fmt.Errorf("as2: the content key: %w", err)
		}
		return contentKey, nil
	}
	return nil, errors.New("as2: no recipient of the message is our certificate")
}

// decryptAES192CBC opens an EnvelopedData with AES-192-CBC, which the
// library does not read; ok is false for any other content.
func decryptAES192CBC(content []byte, cert *x509.Certificate, key crypto.Signer) (out []byte, ok bool, err error) {
	var ed envelopedDataIn
	if _, err := asn1.Unmarshal(content, &ed); err != nil ||
		!ed.EncryptedContentInfo.ContentEncryptionAlgorithm.Algorithm.Equal(oidAES192CBC) {
		return nil, false, nil
	}
	contentKey, err := contentKeyFor(ed.RecipientInfos, cert, key)
	if err != nil {
		return nil, true, err
	}
	var iv []byte
	if _, err := asn1.Unmarshal(ed.EncryptedContentInfo.ContentEncryptionAlgorithm.Parameters.FullBytes, &iv); err != nil {
		return nil, true, fmt.Errorf("as2: the AES-192-CBC IV: %w", err)
	}
	block, err := aes.NewCipher(contentKey)
	if err != nil {
		return nil, true, err
	}
	data, err := ed.EncryptedContentInfo.content()
	if err != nil {
		return nil, true, err
	}
	data = append([]byte(nil), data...)
	if len(iv) != block.BlockSize() || len(data) == 0 || len(data)%block.BlockSize() != 0 {
		return nil, true, errors.New("as2: malformed AES-192-CBC content")
	}
	cipher.NewCBCDecrypter(block, iv).CryptBlocks(data, data)
	pad := int(data[len(data)-1])
	if pad == 0 || pad > block.BlockSize() || pad > len(data) {
		return nil, true, errors.New("as2: bad AES-192-CBC padding")
	}
	for _, b := range data[len(data)-pad:] {
		if int(b) != pad {
			return nil, true, errors.New("as2: bad AES-192-CBC padding")
		}
	}
	return data[:len(data)-pad], true, nil
}

// oaepHashes reads RSAES-OAEP-params: the hash and the MGF1 hash (SHA-1
// by default for both).
func oaepHashes(params []byte) (crypto.Hash, crypto.Hash, error) {
	h, mgf := crypto.SHA1, crypto.SHA1
	if len(params) == 0 {
		return h, mgf, nil
	}
	var p struct {
		Hash pkix.AlgorithmIdentifier `asn1:"optional,explicit,tag:0"`
		MGF  pkix.AlgorithmIdentifier `asn1:"optional,explicit,tag:1"`
	}
	if _, err := asn1.Unmarshal(params, &p); err != nil {
		return 0, 0, fmt.Errorf("as2: RSAES-OAEP parameters: %w", err)
	}
	byOID := func(oid asn1.ObjectIdentifier) (crypto.Hash, error) {
		for _, c := range []crypto.Hash{crypto.SHA1, crypto.SHA256, crypto.SHA384, crypto.SHA512} {
			if o, _ := digestOID(c); o.Equal(oid) {
				return c, nil
			}
		}
		return 0, fmt.Errorf("as2: OAEP hash %v is not supported", oid)
	}
	var err error
	if len(p.Hash.Algorithm) > 0 {
		if h, err = byOID(p.Hash.Algorithm); err != nil {
			return 0, 0, err
		}
	}
	mgf = h
	if len(p.MGF.Algorithm) > 0 {
		var inner pkix.AlgorithmIdentifier
		if _, err := asn1.Unmarshal(p.MGF.Parameters.FullBytes, &inner); err == nil && len(inner.Algorithm) > 0 {
			if mgf, err = byOID(inner.Algorithm); err != nil {
				return 0, 0, err
			}
		}
	} else {
		mgf = crypto.SHA1
	}
	return h, mgf, nil
}
