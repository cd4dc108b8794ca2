package as2

import (
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Outgoing is an AS2 message ready to post: its HTTP headers and body, and
// the MIC the partner's MDN must return.
type Outgoing struct {
	Header http.Header
	Body   []byte
	// MIC is the base64 digest, with MICAlg, of what the receiver checks
	// (RFC 4130 §7.3.1): the signed entity, headers included, when signed;
	// the entity before encryption when only encrypted; the payload alone
	// otherwise.
	MIC    string
	MICAlg crypto.Hash
}

// Pack builds the message carrying payload (of contentType, e.g.
// application/edi-x12) to partner under messageID (without angle
// brackets), per the partner's agreement: signed (multipart/signed,
// detached, the certificate included) and/or encrypted (application/
// pkcs7-mime enveloped-data, binary), with the headers that ask for the
// agreed MDN. date is the Date header (keep it with the message: an AS2
// Message-ID is reused only with the same content and Date).
//
// Every part of a retry's bytes is the same as the first attempt's but for
// what CMS makes fresh on each call: the content-encryption key and IV of an
// encrypted message, and the signing-time attribute (and so the signature
// value) of a signed one.
func (p *Profile) Pack(partner *Partner, messageID, contentType string, payload []byte, date string) (*Outgoing, error) {
	if partner == nil {
		return nil, errors.New("as2: no partner")
	}
	out := &Outgoing{Header: http.Header{}}
	inner := entity(contentType, payload, "Content-Transfer-Encoding", "binary")
	bodyType, body := contentType, payload
	out.MIC, out.MICAlg = ExpectedMIC(partner, contentType, payload)
	if partner.Sign != 0 {
		sig, err := signDetached(inner, p.Certificate, p.Key, partner.Sign)
		if err != nil {
			return nil, err
		}
		boundary := boundaryFor(messageID, "signed")
		bodyType = `multipart/signed; protocol="application/pkcs7-signature"; micalg=` + micalgName(partner.Sign) + `; boundary="` + boundary + `"`
		body = multipartSigned(boundary, inner, sig)
		inner = entity(bodyType, body)
	}
	if partner.Encrypt != EncryptNone {
		der, err := encrypt(inner, partner.Certificate, partner.Encrypt)
		if err != nil {
			return nil, err
		}
		bodyType = `application/pkcs7-mime; smime-type=enveloped-data; name="smime.p7m"`
		body = der
		out.Header.Set("Content-Transfer-Encoding", "binary")
		out.Header.Set("Content-Disposition", `attachment; filename="smime.p7m"`)
	}
	out.Body = body
	h := out.Header
	h.Set("Content-Type", bodyType)
	h.Set("MIME-Version", "1.0")
	h.Set("Message-ID", "<"+messageID+">")
	h.Set("AS2-Version", "1.2")
	h.Set("AS2-From", quoteName(p.AS2ID))
	h.Set("AS2-To", quoteName(partner.AS2ID))
	h.Set("Date", date)
	h.Set("Subject", "EDI message "+messageID)
	if partner.MDN != MDNNone {
		h.Set("Disposition-Notification-To", p.AS2ID)
		if partner.MDNSign != 0 {
			h.Set("Disposition-Notification-Options", "signed-receipt-protocol=optional, pkcs7-signature; signed-receipt-micalg=optional, "+micalgName(partner.MDNSign))
		}
		if partner.MDN == MDNAsync {
			h.Set("Receipt-Delivery-Option", p.MDNURL)
		}
	}
	return out, nil
}

// ExpectedMIC is the MIC (and its algorithm) a receipt for payload, sent
// to partner as contentType, must return: Pack's, computed again without
// the cryptography, so an asynchronous MDN can be checked against the row.
func ExpectedMIC(partner *Partner, contentType string, payload []byte) (string, crypto.Hash) {
	alg := micAlgFor(partner.MDNSign, partner.Sign)
	if partner.Sign == 0 && partner.Encrypt == EncryptNone {
		return mic(payload, alg), alg
	}
	return mic(entity(contentType, payload, "Content-Transfer-Encoding", "binary"), alg), alg
}

// micAlgFor is the MIC algorithm both sides use (RFC 4130 §7.3.1): the one
// the sender asked for in signed-receipt-micalg, else the signature's, else
// SHA-1.
func micAlgFor(requested, signature crypto.Hash) crypto.Hash {
	switch {
	case requested != 0:
		return requested
	case signature != 0:
		return signature
	}
	return crypto.SHA1
}

// boundaryFor derives a multipart boundary from the message id, so that
// retries carry the same one.
func boundaryFor(messageID, what string) string {
	sum := sha256.Sum256([]byte(what + "\x00" + messageID))
	return "idem-" + what + "-" + hex.EncodeToString(sum[:12])
}

// multipartSigned is the body of a multipart/signed: the signed entity,
// then the detached signature in base64.
func multipartSigned(boundary string, signed, sig []byte) []byte {
	var b strings.Builder
	b.WriteString("--" + boundary + "\r\n")
	b.Write(signed)
	b.WriteString("\r\n--" + boundary + "\r\n")
	b.WriteString("Content-Type: application/pkcs7-signature; name=\"smime.p7s\"\r\n")
	b.WriteString("Content-Transfer-Encoding: base64\r\n")
	b.WriteString("Content-Disposition: attachment; filename=\"smime.p7s\"\r\n\r\n")
	b.Write(base64Lines(sig))
	b.WriteString("--" + boundary + "--\r\n")
	return []byte(b.String())
}

// quoteName quotes an AS2 name with spaces (RFC 4130 §6.2).
func quoteName(s string) string {
	if strings.ContainsAny(s, " \t") {
		return `"` + s + `"`
	}
	return s
}

// Addressed returns the partner a message's headers say it is from
// (AS2-From) when they say it is for us (AS2-To), else nil: what an
// endpoint can tell before it reads the body. Unpack checks the same.
func (p *Profile) Addressed(h http.Header) *Partner {
	if unquoteName(h.Get("AS2-To")) != p.AS2ID {
		return nil
	}
	return p.Partners[unquoteName(h.Get("AS2-From"))]
}

// unquoteName reads an AS2-From or AS2-To value.
func unquoteName(s string) string {
	s = strings.TrimSpace(s)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return strings.ReplaceAll(s[1:len(s)-1], `\"`, `"`)
	}
	return s
}

// Failure is why an incoming message was refused, as the disposition
// modifier of the error MDN names it (RFC 4130 §7.4.3).
//
// Err is the detail, for the log only: it may quote a cryptographic
// library, and what a library says about a failed decryption is exactly
// what a padding-oracle attack needs. Text is what may be told to the
// sender.
type Failure struct {
	// Modifier is authentication-failed, decryption-failed,
	// insufficient-message-security, integrity-check-failed or
	// unexpected-processing-error.
	Modifier string
	Err      error
}

// Error is the modifier and the detail, for the log.
func (f *Failure) Error() string { return f.Modifier + ": " + f.Err.Error() }
func (f *Failure) Unwrap() error { return f.Err }

// Text is the answer for the sender: the modifier and a fixed sentence
// that depends on nothing else, so two failures of one kind cannot be told
// apart from outside.
func (f *Failure) Text() string {
	switch f.Modifier {
	case AuthenticationFailed:
		return f.Modifier + ": the message could not be authenticated"
	case DecryptionFailed:
		return f.Modifier + ": the message could not be decrypted"
	case InsufficientMessageSecurity:
		return f.Modifier + ": the message lacks the signature or the encryption the agreement requires"
	case IntegrityCheckFailed:
		return f.Modifier + ": the message failed its integrity check"
	}
	return UnexpectedProcessingError + ": the message could not be processed"
}

// The disposition modifiers of a failed message.
const (
	AuthenticationFailed        = "authentication-failed"
	DecryptionFailed            = "decryption-failed"
	InsufficientMessageSecurity = "insufficient-message-security"
	IntegrityCheckFailed        = "integrity-check-failed"
	UnexpectedProcessingError   = "unexpected-processing-error"
)

func fail(modifier string, err error) *Failure { return &Failure{Modifier: modifier, Err: err} }

// Incoming is an AS2 message opened by Unpack.
type Incoming struct {
	MessageID string // without angle brackets
	From, To  string
	Partner   *Partner
	// Payload and its Content-Type, transfer encoding undone.
	Payload     []byte
	ContentType string
	Signed      bool
	Encrypted   bool
	// MIC of what was received (RFC 4130 §7.3.1), with MICAlg, for the MDN.
	MIC    string
	MICAlg crypto.Hash
	// The receipt asked for: none when MDNTo is "".
	MDNTo string
	// MDNSign is the MIC algorithm of the signed MDN asked for (0: unsigned).
	MDNSign crypto.Hash
	// ReceiptTo is where to send an asynchronous MDN ("" for a synchronous
	// one), as the sender asked: an address the partner's agreement must
	// allow (Partner.AsyncMDNURLs) before anything is sent there.
	ReceiptTo string
	// Authenticated is true when the message came from Partner as well as
	// the agreement can tell: signed by the partner's certificate when the
	// agreement says sign, encrypted when it says encrypt. A partner that
	// neither signs nor encrypts is known by its AS2-From name alone.
	Authenticated bool
}

// Unpack opens an AS2 message posted to us: it finds the partner by
// AS2-From, decrypts, verifies the partner's signature against the
// partner's configured certificate, computes the MIC, enforces the
// agreement (a partner configured to sign must sign, one configured to
// encrypt must encrypt) and returns the payload with Authenticated set.
// Whatever fails is a *Failure naming the MDN disposition modifier; the
// Incoming returned with it carries what was read before the failure (at
// least the Message-ID and the MDN request when they were present). An
// unknown AS2-From or AS2-To leaves Incoming.Partner nil.
//
// Every failure inside an encrypted message — the envelope, the padding,
// the decrypted content, its signature — is decryption-failed, so that
// nothing about the plaintext can be learnt from the answers to altered
// copies of a captured message (a padding oracle).
func (p *Profile) Unpack(h http.Header, body []byte) (*Incoming, error) {
	in := &Incoming{
		MessageID: strings.Trim(strings.TrimSpace(h.Get("Message-ID")), "<>"),
		From:      unquoteName(h.Get("AS2-From")),
		To:        unquoteName(h.Get("AS2-To")),
		MDNTo:     h.Get("Disposition-Notification-To"),
		ReceiptTo: strings.TrimSpace(h.Get("Receipt-Delivery-Option")),
	}
	in.MDNSign, in.MICAlg = requestedMICAlg(h.Get("Disposition-Notification-Options"))
	if in.To != p.AS2ID {
		return in, fail(AuthenticationFailed, fmt.Errorf("AS2-To %q is not us (%q)", in.To, p.AS2ID))
	}
	partner := p.Partners[in.From]
	if partner == nil {
		return in, fail(AuthenticationFailed, fmt.Errorf("AS2-From %q is no partner of ours", in.From))
	}
	in.Partner = partner
	if in.MessageID == "" {
		return in, fail(UnexpectedProcessingError, errors.New("no Message-ID"))
	}
	encrypted, err := p.open(in, h, body)
	if err != nil {
		if f := err.(*Failure); encrypted && f.Modifier != DecryptionFailed {
			return in, fail(DecryptionFailed, f)
		}
		return in, err
	}
	switch {
	case partner.Encrypt != EncryptNone && !in.Encrypted:
		return in, fail(InsufficientMessageSecurity, fmt.Errorf("the agreement with %s asks for encryption; the message is not encrypted", partner.AS2ID))
	case partner.Sign != 0 && !in.Signed:
		f := fail(InsufficientMessageSecurity, fmt.Errorf("the agreement with %s asks for a signature; the message is not signed", partner.AS2ID))
		if in.Encrypted {
			f = fail(DecryptionFailed, f)
		}
		return in, f
	}
	in.Authenticated = true
	return in, nil
}

// open decrypts, verifies and decodes the message into in; encrypted
// reports whether the message was an encrypted one, whatever failed.
func (p *Profile) open(in *Incoming, h http.Header, body []byte) (encrypted bool, _ error) {
	var micData []byte     // what the MIC covers, once known
	var sigAlg crypto.Hash // the signature's micalg
	ent := entity(h.Get("Content-Type"), body, "Content-Transfer-Encoding", h.Get("Content-Transfer-Encoding"))
	hdr, raw, err := splitEntity(ent)
	if err != nil {
		return false, fail(UnexpectedProcessingError, err)
	}
	mt, params, err := mediaType(hdr.Get("Content-Type"))
	if err != nil {
		return false, fail(UnexpectedProcessingError, err)
	}
	encrypted = mt == "application/pkcs7-mime" || mt == "application/x-pkcs7-mime"
	data, err := decodeBody(hdr, raw)
	if err != nil {
		return encrypted, fail(UnexpectedProcessingError, err)
	}
	if encrypted {
		plain, err := decrypt(data, p.Certificate, p.Key)
		if err != nil {
			return true, fail(DecryptionFailed, err)
		}
		in.Encrypted = true
		micData = plain
		ent = plain
		if hdr, raw, err = splitEntity(ent); err != nil {
			return true, fail(UnexpectedProcessingError, err)
		}
		if data, err = decodeBody(hdr, raw); err != nil {
			return true, fail(UnexpectedProcessingError, err)
		}
		if mt, params, err = mediaType(hdr.Get("Content-Type")); err != nil {
			return true, fail(UnexpectedProcessingError, err)
		}
	}
	if mt == "multipart/signed" {
		parts, err := splitMultipart(data, params["boundary"], 2)
		if err != nil || len(parts) != 2 {
			return encrypted, fail(IntegrityCheckFailed, fmt.Errorf("a multipart/signed body with %d parts: %v", len(parts), err))
		}
		sh, sraw, err := splitEntity(parts[1])
		if err != nil {
			return encrypted, fail(IntegrityCheckFailed, err)
		}
		sig, err := decodeBody(sh, sraw)
		if err != nil {
			return encrypted, fail(IntegrityCheckFailed, err)
		}
		if err := verifyDetached(sig, parts[0], in.Partner.Certificate); err != nil {
			return encrypted, fail(AuthenticationFailed, err)
		}
		in.Signed = true
		sigAlg, _ = parseHash(params["micalg"])
		micData = parts[0]
		if hdr, raw, err = splitEntity(parts[0]); err != nil {
			return encrypted, fail(UnexpectedProcessingError, err)
		}
		if data, err = decodeBody(hdr, raw); err != nil {
			return encrypted, fail(UnexpectedProcessingError, err)
		}
		if _, _, err = mediaType(hdr.Get("Content-Type")); err != nil {
			return encrypted, fail(UnexpectedProcessingError, err)
		}
	}
	if micData == nil {
		micData = data // neither signed nor encrypted: the content alone
	}
	in.MICAlg = micAlgFor(in.MICAlg, sigAlg)
	in.MIC = mic(micData, in.MICAlg)
	in.Payload, in.ContentType = data, hdr.Get("Content-Type")
	return encrypted, nil
}

// requestedMICAlg reads Disposition-Notification-Options: whether a signed
// MDN is asked for (its protocol pkcs7-signature) and the first MIC
// algorithm of signed-receipt-micalg we support.
func requestedMICAlg(v string) (signed, micAlg crypto.Hash) {
	for _, opt := range strings.Split(v, ";") {
		name, val, ok := strings.Cut(opt, "=")
		if !ok {
			continue
		}
		items := strings.Split(val, ",")
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "signed-receipt-micalg":
			for _, it := range items[1:] {
				if h, err := parseHash(it); err == nil && h != 0 {
					micAlg = h
					break
				}
			}
		}
	}
	if micAlg != 0 && strings.Contains(strings.ToLower(v), "pkcs7-signature") {
		signed = micAlg
	}
	return signed, micAlg
}
