package as2

import (
	"bufio"
	"bytes"
	"crypto"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"time"
)

// MDN is a message disposition notification: the receipt for one AS2
// message (RFC 4130 §7, RFC 3798).
type MDN struct {
	MessageID         string // of the MDN itself
	OriginalMessageID string // of the message it answers, without angle brackets
	// Disposition as sent, e.g. "automatic-action/MDN-sent-automatically;
	// processed" or "…; processed/error: authentication-failed".
	Disposition string
	// MIC and MICAlg are Received-Content-MIC (empty when absent).
	MIC    string
	MICAlg crypto.Hash
	// Signed is true when the MDN was signed (and the signature verified).
	Signed bool
}

// Processed reports whether the disposition is "processed" with no error,
// failure or warning modifier.
func (m *MDN) Processed() bool {
	_, d, _ := strings.Cut(m.Disposition, ";")
	return strings.EqualFold(strings.TrimSpace(d), "processed")
}

// Modifier returns the error or failure text of the disposition ("" when
// processed).
func (m *MDN) Modifier() string {
	_, d, _ := strings.Cut(m.Disposition, ";")
	if _, mod, ok := strings.Cut(d, "/"); ok {
		return strings.TrimSpace(mod)
	}
	if !m.Processed() {
		return strings.TrimSpace(d)
	}
	return ""
}

// BuildMDN is the receipt for in: processed, or processed/error with the
// failure's modifier (failure nil: processed). It is signed, with the MIC
// algorithm asked for, when the sender asked for a signed receipt and we
// know the partner. Its bytes are the same whenever it is built again for
// the same message and outcome (a duplicate gets the same answer), but for
// the signing time of a signed one. date is the MDN's Date header.
func (p *Profile) BuildMDN(in *Incoming, failure *Failure, date time.Time) (http.Header, []byte, error) {
	disposition := "automatic-action/MDN-sent-automatically; processed"
	text := "The AS2 message was received and processed."
	if failure != nil {
		disposition += "/error: " + failure.Modifier
		text = "The AS2 message could not be processed: " + failure.Modifier + "."
	}
	var fields strings.Builder
	fields.WriteString("Reporting-UA: idem AS2\r\n")
	fields.WriteString("Original-Recipient: rfc822; " + quoteName(p.AS2ID) + "\r\n")
	fields.WriteString("Final-Recipient: rfc822; " + quoteName(p.AS2ID) + "\r\n")
	fields.WriteString("Original-Message-ID: <" + in.MessageID + ">\r\n")
	if failure == nil && in.MIC != "" {
		fields.WriteString("Received-Content-MIC: " + in.MIC + ", " + micalgName(in.MICAlg) + "\r\n")
	}
	fields.WriteString("Disposition: " + disposition + "\r\n")
	boundary := boundaryFor(in.MessageID+"\x00"+disposition, "report")
	report := entity(`multipart/report; report-type=disposition-notification; boundary="`+boundary+`"`, []byte(
		"--"+boundary+"\r\n"+
			"Content-Type: text/plain; charset=us-ascii\r\n\r\n"+text+"\r\n"+
			"--"+boundary+"\r\n"+
			"Content-Type: message/disposition-notification\r\n\r\n"+fields.String()+
			"\r\n--"+boundary+"--\r\n"))
	h := http.Header{}
	h.Set("MIME-Version", "1.0")
	h.Set("AS2-Version", "1.2")
	h.Set("Message-ID", "<"+boundaryFor(in.MessageID+"\x00"+disposition, "mdn")+"@"+strings.ReplaceAll(p.AS2ID, " ", "_")+">")
	h.Set("AS2-From", quoteName(p.AS2ID))
	h.Set("AS2-To", quoteName(in.From))
	h.Set("Date", date.UTC().Format(http.TimeFormat))
	h.Set("Subject", "Message Disposition Notification")
	rh, rbody, err := splitEntity(report)
	if err != nil {
		return nil, nil, err
	}
	// An MDN is signed only for a message whose sender was authenticated:
	// signed for anyone who asks, with a partner's name and a Message-ID
	// of its choosing, it would be a receipt with our signature that the
	// partner's own endpoint trusts (a signing oracle).
	if in.MDNSign == 0 || in.Partner == nil || !in.Authenticated {
		h.Set("Content-Type", rh.Get("Content-Type"))
		return h, rbody, nil
	}
	sig, err := signDetached(report, p.Certificate, p.Key, in.MDNSign)
	if err != nil {
		return nil, nil, err
	}
	sb := boundaryFor(in.MessageID+"\x00"+disposition, "mdnsigned")
	h.Set("Content-Type", `multipart/signed; protocol="application/pkcs7-signature"; micalg=`+micalgName(in.MDNSign)+`; boundary="`+sb+`"`)
	return h, multipartSigned(sb, report, sig), nil
}

// ParseMDN reads an MDN from partner: a signed one is verified against the
// partner's certificate (a signature that does not verify is an error);
// the disposition-notification fields are returned.
//
// A report of more than maxReportParts parts is refused.
func ParseMDN(h http.Header, body []byte, partner *Partner) (*MDN, error) {
	mt, params, err := mediaType(h.Get("Content-Type"))
	if err != nil {
		return nil, err
	}
	m := &MDN{MessageID: strings.Trim(strings.TrimSpace(h.Get("Message-ID")), "<>")}
	if mt == "multipart/signed" {
		parts, err := splitMultipart(body, params["boundary"], 2)
		if err != nil || len(parts) != 2 {
			return nil, fmt.Errorf("as2: a signed MDN with %d parts: %v", len(parts), err)
		}
		sh, sraw, err := splitEntity(parts[1])
		if err != nil {
			return nil, err
		}
		sig, err := decodeBody(sh, sraw)
		if err != nil {
			return nil, err
		}
		if err := verifyDetached(sig, parts[0], partner.Certificate); err != nil {
			return nil, err
		}
		m.Signed = true
		rh, rbody, err := splitEntity(parts[0])
		if err != nil {
			return nil, err
		}
		if mt, params, err = mediaType(rh.Get("Content-Type")); err != nil {
			return nil, err
		}
		if body, err = decodeBody(rh, rbody); err != nil {
			return nil, err
		}
	}
	if mt != "multipart/report" {
		return nil, fmt.Errorf("as2: an MDN of type %s, want multipart/report", mt)
	}
	parts, err := splitMultipart(body, params["boundary"], maxReportParts)
	if err != nil {
		return nil, err
	}
	for _, part := range parts {
		ph, pbody, err := splitEntity(part)
		if err != nil {
			return nil, err
		}
		pmt, _, _ := mediaType(ph.Get("Content-Type"))
		if pmt != "message/disposition-notification" {
			continue
		}
		if pbody, err = decodeBody(ph, pbody); err != nil {
			return nil, err
		}
		f, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(bytes.TrimLeft(pbody, "\r\n"), "\r\n\r\n"...)))).ReadMIMEHeader()
		if err != nil && len(f) == 0 {
			return nil, fmt.Errorf("as2: the disposition notification: %w", err)
		}
		m.OriginalMessageID = strings.Trim(strings.TrimSpace(f.Get("Original-Message-ID")), "<>")
		m.Disposition = strings.TrimSpace(f.Get("Disposition"))
		if v := f.Get("Received-Content-MIC"); v != "" {
			digest, alg, _ := strings.Cut(v, ",")
			m.MIC = strings.TrimSpace(digest)
			m.MICAlg, _ = parseHash(alg)
		}
		if m.Disposition == "" {
			return nil, errors.New("as2: the MDN has no Disposition")
		}
		return m, nil
	}
	return nil, errors.New("as2: the MDN has no message/disposition-notification part")
}

// Check decides whether m acknowledges out, sent as messageID to partner:
// the signature verified when a signed MDN was asked for, the original
// message id is ours, the disposition is processed, and the MIC is the one
// we computed. The error says which check failed.
func (out *Outgoing) Check(m *MDN, messageID string, partner *Partner) error {
	switch {
	case partner.MDNSign != 0 && !m.Signed:
		return errors.New("as2: the MDN is not signed; a signed one was asked for")
	case m.OriginalMessageID != messageID:
		return fmt.Errorf("as2: the MDN answers %q, not %q", m.OriginalMessageID, messageID)
	case !m.Processed():
		return fmt.Errorf("as2: the partner reports %q", m.Disposition)
	case m.MIC != out.MIC || m.MICAlg != out.MICAlg:
		return fmt.Errorf("as2: the MDN's MIC %q (%s) differs from ours %q (%s)", m.MIC, micalgName(m.MICAlg), out.MIC, micalgName(out.MICAlg))
	}
	return nil
}

// maxReportParts bounds the parts of an MDN's multipart/report: the text,
// the disposition notification and the returned message or headers, with
// room to spare.
const maxReportParts = 8
