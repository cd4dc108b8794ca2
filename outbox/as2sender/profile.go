package as2sender

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/edi"
	"github.com/idemgo/idem/outbox"
)

// ProfileSender sends to as2://PARTNER destinations under an AS2 profile
// (as2.LoadProfile): signed and/or encrypted as the partner's agreement
// says, with the Message-ID derived from the key (or the row's Message-ID
// header, set when it was enqueued), the same on every attempt.
//
// A row is acked only on a receipt that proves delivery: a synchronous MDN
// whose signature verifies against the partner's certificate (when a signed
// one was asked for), that answers our Message-ID, says processed, and
// returns the MIC we computed; or, for partners that send no MDN, a 2xx.
// With asynchronous MDNs a 2xx makes the row sent, and the MDN acks it when
// it arrives. Otherwise last_error says why: a negative disposition that
// retrying cannot cure (authentication-failed, decryption-failed, failed/…)
// makes the row dead; a wrong MIC, a bad signature, an unreadable MDN or any
// other error is retried.
type ProfileSender struct {
	profile *as2.Profile
	client  *http.Client
}

// NewProfile returns the sender of profile's partners, posting with client
// (nil: a client with a 30-second timeout).
func NewProfile(profile *as2.Profile, client *http.Client) *ProfileSender {
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	return &ProfileSender{profile: profile, client: client}
}

// MessageID is the AS2 Message-ID (without angle brackets) under which the
// row with key and headers is sent: its Message-ID header, else one derived
// from the key and our AS2 name.
func (s *ProfileSender) MessageID(key string, headers map[string]string) string {
	if id := headers["Message-ID"]; id != "" {
		return strings.Trim(id, "<>")
	}
	host := strings.ToLower(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, s.profile.AS2ID)) + ".as2"
	return strings.Trim(edi.AS2MessageID(key, host), "<>")
}

// Send implements outbox.Sender.
func (s *ProfileSender) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	u, err := url.Parse(m.Destination)
	if err != nil || u.Scheme != "as2" || u.Host == "" {
		return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("want as2://PARTNER, got %q", m.Destination)}
	}
	name, _ := url.PathUnescape(u.Host)
	partner := s.profile.Partners[name]
	if partner == nil {
		return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("%q is not a partner in the AS2 profile", name)}
	}
	if partner.URL == "" {
		return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("partner %q has no url to post to", name)}
	}
	ct := m.Headers["Content-Type"]
	if ct == "" {
		ct = edi.ContentType(edi.EDIFACT)
		if bytes.HasPrefix(bytes.TrimSpace(m.Payload), []byte("ISA")) {
			ct = edi.ContentType(edi.X12)
		}
	}
	date := m.Headers["Date"]
	if date == "" {
		date = time.Unix(0, 0).UTC().Format(http.TimeFormat) // stable: the same on every attempt
	}
	id := s.MessageID(m.Key, m.Headers)
	out, err := s.profile.Pack(partner, id, ct, m.Payload, date)
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, partner.URL, bytes.NewReader(out.Body))
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	req.Header = out.Header
	resp, err := s.client.Do(req)
	if err != nil {
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("reading the answer: %w", err)}
	}
	switch {
	case resp.StatusCode >= 500 || resp.StatusCode == 408 || resp.StatusCode == 409 || resp.StatusCode == 429:
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("%s", resp.Status)}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("%s: %s", resp.Status, clip(body))}
	}
	switch partner.MDN {
	case as2.MDNNone:
		return outbox.Result{Status: outbox.Acked}
	case as2.MDNAsync:
		return outbox.Result{Status: outbox.Sent}
	}
	mdn, err := as2.ParseMDN(resp.Header, body, partner)
	if err != nil {
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("the synchronous MDN: %w", err)}
	}
	if err := out.Check(mdn, id, partner); err != nil {
		status := outbox.Pending
		if !mdn.Processed() && mdn.OriginalMessageID == id && hopeless(mdn) {
			status = outbox.Dead
		}
		return outbox.Result{Status: status, Err: err}
	}
	return outbox.Result{Status: outbox.Acked}
}

// hopeless reports a negative disposition that the same message sent again
// cannot cure: the partner cannot authenticate or decrypt what we send (a
// certificate or agreement to fix first), or it failed the message.
func hopeless(m *as2.MDN) bool {
	mod := strings.ToLower(m.Modifier())
	return strings.HasPrefix(mod, "failure") || strings.Contains(mod, as2.AuthenticationFailed) || strings.Contains(mod, as2.DecryptionFailed)
}

func clip(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
