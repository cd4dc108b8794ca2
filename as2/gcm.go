package as2

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/des"
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
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
	//lint:ignore SA1019 AS2 partners (RFC 4130, CMS key transport) expect RSA PKCS#1 v1.5; OAEP is what they must agree to first
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
	eci := ad.AuthEncryptedContentInfo
	keySize := 0
	switch alg := eci.ContentEncryptionAlgorithm.Algorithm; {
	case alg.Equal(oidAES128GCM):
		keySize = 16
	case alg.Equal(oidAES256GCM):
		keySize = 32
	default:
		return nil, fmt.Errorf("as2: content encryption %v is not supported", alg)
	}
	contentKey, err := contentKeyFor(ad.RecipientInfos, cert, key, keySize)
	if err != nil {
		return nil, err
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

// contentKeyFor decrypts the content key, of size bytes, of the recipient
// that is cert (issuer and serial number), transported with RSA PKCS#1 v1.5
// or RSAES-OAEP. A key that does not decrypt is replaced by random bytes
// of the right size (implicit rejection, RFC 3218 §2.3.2): the content then
// fails to decrypt like any other tampered content, and the answer tells
// nothing about the RSA padding.
func contentKeyFor(ris []keyTransRecipientInfo, cert *x509.Certificate, key crypto.Signer, size int) ([]byte, error) {
	priv, ok := key.(*rsa.PrivateKey)
	if !ok {
		return nil, errors.New("as2: the private key is not RSA")
	}
	for _, ri := range ris {
		if ri.IssuerAndSerialNumber.SerialNumber == nil || ri.IssuerAndSerialNumber.SerialNumber.Cmp(cert.SerialNumber) != 0 ||
			string(ri.IssuerAndSerialNumber.IssuerName.FullBytes) != string(cert.RawIssuer) {
			continue
		}
		contentKey := make([]byte, size)
		if _, err := rand.Read(contentKey); err != nil {
			return nil, err
		}
		switch alg := ri.KeyEncryptionAlgorithm; {
		case alg.Algorithm.Equal(oidRSAEncryption):
			// Leaves contentKey random unless the padding is right and the
			// key has the size asked for.
			//lint:ignore SA1019 the partners' PKCS#1 v1.5 key transport, read with implicit rejection (docs/security.md)
			if err := rsa.DecryptPKCS1v15SessionKey(nil, priv, ri.EncryptedKey, contentKey); err != nil {
				return nil, fmt.Errorf("as2: the content key: %w", err)
			}
		case alg.Algorithm.Equal(oidRSAESOAEP):
			h, mgf, err := oaepHashes(alg.Parameters.FullBytes)
			if err != nil {
				return nil, err
			}
			if k, err := priv.Decrypt(nil, ri.EncryptedKey, &rsa.OAEPOptions{Hash: h, MGFHash: mgf}); err == nil && len(k) == size {
				contentKey = k
			}
		default:
			return nil, fmt.Errorf("as2: key transport %v is not supported", alg.Algorithm)
		}
		return contentKey, nil
	}
	return nil, errors.New("as2: no recipient of the message is our certificate")
}

// cbcAlgorithms are the content encryptions of an EnvelopedData idem
// reads: the cipher and its key size.
var cbcAlgorithms = []struct {
	oid      asn1.ObjectIdentifier
	keySize  int
	newBlock func([]byte) (cipher.Block, error)
}{
	{oidDESEDE3CBC, 24, des.NewTripleDESCipher},
	{oidAES128CBC, 16, aes.NewCipher},
	{oidAES192CBC, 24, aes.NewCipher},
	{oidAES256CBC, 32, aes.NewCipher},
}

// decryptCBC opens an EnvelopedData with DES-EDE3-CBC or AES-CBC and
// removes its padding. The padding is checked over the whole last block
// without branching on its bytes, and every way it can be wrong is the same
// error.
func decryptCBC(content []byte, cert *x509.Certificate, key crypto.Signer) ([]byte, error) {
	var ed envelopedDataIn
	if _, err := asn1.Unmarshal(content, &ed); err != nil {
		return nil, fmt.Errorf("as2: EnvelopedData: %w", err)
	}
	eci := ed.EncryptedContentInfo
	alg := -1
	for i, a := range cbcAlgorithms {
		if eci.ContentEncryptionAlgorithm.Algorithm.Equal(a.oid) {
			alg = i
		}
	}
	if alg < 0 {
		return nil, fmt.Errorf("as2: content encryption %v is not supported", eci.ContentEncryptionAlgorithm.Algorithm)
	}
	contentKey, err := contentKeyFor(ed.RecipientInfos, cert, key, cbcAlgorithms[alg].keySize)
	if err != nil {
		return nil, err
	}
	block, err := cbcAlgorithms[alg].newBlock(contentKey)
	if err != nil {
		return nil, err
	}
	var iv []byte
	if _, err := asn1.Unmarshal(eci.ContentEncryptionAlgorithm.Parameters.FullBytes, &iv); err != nil || len(iv) != block.BlockSize() {
		return nil, errors.New("as2: the CBC IV is not one block")
	}
	data, err := eci.content()
	if err != nil {
		return nil, err
	}
	bs := block.BlockSize()
	if len(data) == 0 || len(data)%bs != 0 {
		return nil, errors.New("as2: the encrypted content is not whole blocks")
	}
	data = append([]byte(nil), data...)
	cipher.NewCBCDecrypter(block, iv).CryptBlocks(data, data)
	n, ok := unpad(data, bs)
	if !ok {
		return nil, errors.New("as2: the decrypted content is not padded")
	}
	return data[:n], nil
}

// unpad checks the PKCS#7 padding of data (a whole number of blocks of bs
// bytes) and returns the length without it. It reads the whole last block
// whatever the pad length, and never indexes by an unchecked pad byte.
func unpad(data []byte, bs int) (int, bool) {
	last := data[len(data)-bs:]
	pad := int(last[bs-1])
	bad := subtle.ConstantTimeEq(int32(pad), 0) | (1 - subtle.ConstantTimeLessOrEq(pad, bs))
	for i := 0; i < bs; i++ {
		inPad := subtle.ConstantTimeLessOrEq(bs-i, pad) // the last pad bytes
		bad |= inPad & (1 - subtle.ConstantTimeByteEq(last[i], byte(pad)))
	}
	if bad != 0 {
		return 0, false
	}
	return len(data) - pad, true
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
