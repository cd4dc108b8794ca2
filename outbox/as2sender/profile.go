package as2sender

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/edi"
	"github.com/idemgo/idem/internal/redirect"
	"github.com/idemgo/idem/outbox"
)

// ProfileSender sends to as2://PARTNER destinations under an AS2 profile
// (as2.LoadProfile): signed and/or encrypted as the partner's agreement
// says, under the row's ExternalID as Message-ID (else one derived from the
// key, MessageIDFor), the same on every attempt.
//
// A row is acked only on a receipt that proves delivery: a synchronous MDN
// whose signature verifies against the partner's certificate (when a signed
// one was asked for), that answers our Message-ID, says processed, and
// returns the MIC we computed; or, for partners that send no MDN, a 2xx.
// With asynchronous MDNs a 2xx makes the row sent, and the MDN acks it when
// it arrives (AsyncMDNHandler). Otherwise last_error says why: a negative disposition that
// retrying cannot cure (authentication-failed, decryption-failed, failed/…)
// makes the row dead; a wrong MIC, a bad signature, an unreadable MDN or any
// other error is retried. A negative MDN makes the row dead only when it
// passes the partner's MDN policy (signed, where mdn_sign asks for it).
type ProfileSender struct {
	profile *as2.Profile
	client  *http.Client
}

// NewProfile returns the sender of profile's partners, posting with client
// (nil: a client with a 30-second timeout). It follows no redirect: a 3xx
// from a partner's agreed URL is the answer, and the message is dead with
// it recorded.
func NewProfile(profile *as2.Profile, client *http.Client) *ProfileSender {
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	client = redirect.Never(client) // an AS2 message goes to the agreed URL only
	return &ProfileSender{profile: profile, client: client}
}

// MessageIDFor is the AS2 Message-ID (without angle brackets) idem derives
// for key as profile's AS2 name: the key, and our AS2 name as the host
// part, so two senders' equal keys never meet at a partner. Store it as the
// row's Message.ExternalID when enqueueing (idem outbox enqueue --as2 does):
// an asynchronous MDN finds the row by it.
func MessageIDFor(profile *as2.Profile, key string) string {
	host := strings.ToLower(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, profile.AS2ID)) + ".as2"
	return strings.Trim(edi.AS2MessageID(key, host), "<>")
}

// messageID is the Message-ID a row is sent under: its ExternalID, else
// its Message-ID header, else MessageIDFor.
func (s *ProfileSender) messageID(m *outbox.Message) string {
	if m.ExternalID != "" {
		return strings.Trim(m.ExternalID, "<>")
	}
	if id := m.Headers["Message-ID"]; id != "" {
		return strings.Trim(id, "<>")
	}
	return MessageIDFor(s.profile, m.Key)
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
	ct := contentType(m)
	date := m.Headers["Date"]
	if date == "" {
		date = time.Unix(0, 0).UTC().Format(http.TimeFormat) // stable: the same on every attempt
	}
	if partner.MDN == as2.MDNAsync && m.ExternalID == "" {
		return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("partner %q answers asynchronously, and its MDN finds the row by Message.ExternalID: enqueue with ExternalID = as2sender.MessageIDFor (idem outbox enqueue --as2 FILE)", name)}
	}
	id := s.messageID(m)
	out, err := s.profile.Pack(partner, id, ct, m.Payload, date)
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, partner.URL, bytes.NewReader(out.Body))
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	req.Header = out.Header
	copyTraceContext(req.Header, m)
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
		// A negative disposition carries no MIC of our bytes: anyone who
		// can post under the partner's name may have caused it. The row
		// is sent again (the partner deduplicates it); MaxTries bounds it.
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("%w: sending again", err)}
	}
	return outbox.Result{Status: outbox.Acked}
}

func clip(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// contentType is the Content-Type a row is sent as: its header, else the
// EDI type its payload starts with.
func contentType(m *outbox.Message) string {
	if ct := m.Headers["Content-Type"]; ct != "" {
		return ct
	}
	if bytes.HasPrefix(bytes.TrimSpace(m.Payload), []byte("ISA")) {
		return edi.ContentType(edi.X12)
	}
	return edi.ContentType(edi.EDIFACT)
}

// AsyncMDNHandler receives the asynchronous MDNs of rows a ProfileSender
// sent (serve it at the profile's mdn_url, POST). An MDN changes a row only
// when all of these hold, and otherwise is refused and changes nothing:
//
//   - AS2-From names a partner of the profile (else 403);
//   - the MDN passes the partner's MDN policy: signed by the partner's
//     certificate where the agreement asks for signed MDNs (mdn_sign), and
//     a signature it carries verifies (else 400);
//   - its Original-Message-ID names a row (Message.ExternalID) addressed to
//     that partner (else 404 or 403);
//   - the row is sent: a pending row was never delivered, and an acked or
//     dead one is settled (else 409).
//
// Then it is checked as a synchronous receipt is — our MIC, processed —
// and the row is acked, or refused with the reason in last_error and sent
// again: a negative disposition carries no MIC of our bytes, so it never
// makes a row dead on its own (the relay's MaxTries does).
func AsyncMDNHandler(profile *as2.Profile, store *outbox.Store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		from := strings.Trim(strings.TrimSpace(r.Header.Get("AS2-From")), `"`)
		partner := profile.Partners[from]
		if partner == nil {
			http.Error(w, "not a partner of this endpoint", http.StatusForbidden)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "the MDN could not be read", http.StatusBadRequest)
			return
		}
		mdn, err := as2.ParseMDN(r.Header, body, partner)
		if err != nil {
			http.Error(w, "the MDN is not accepted: it could not be read or verified", http.StatusBadRequest)
			return
		}
		if partner.MDNSign != 0 && !mdn.Signed {
			http.Error(w, "the MDN is not accepted: the agreement asks for signed MDNs", http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		row, err := store.GetByExternalID(ctx, mdn.OriginalMessageID)
		if err != nil {
			http.Error(w, "no such message of ours", http.StatusNotFound)
			return
		}
		if row.Destination != "as2://"+url.PathEscape(from) && row.Destination != "as2://"+from {
			http.Error(w, "no such message sent to this partner", http.StatusForbidden)
			return
		}
		if row.Status != outbox.Sent {
			http.Error(w, "the message is not awaiting a receipt", http.StatusConflict)
			return
		}
		out := &as2.Outgoing{}
		out.MIC, out.MICAlg = as2.ExpectedMIC(partner, contentType(&row.Message), row.Payload)
		if err := out.Check(mdn, mdn.OriginalMessageID, partner); err != nil {
			// Never dead on an MDN alone: a negative disposition carries no
			// MIC of our bytes.
			if rerr := store.Refuse(ctx, row.Key, err.Error()+": sending again", false); rerr != nil {
				if errors.Is(rerr, outbox.ErrNotFound) {
					http.Error(w, "the message is not awaiting a receipt", http.StatusConflict)
					return
				}
				http.Error(w, "the receipt could not be recorded", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK) // received; the row says why it was no ack
			return
		}
		if err := store.AckSent(ctx, row.Key); err != nil {
			if errors.Is(err, outbox.ErrNotFound) {
				http.Error(w, "the message is not awaiting a receipt", http.StatusConflict)
				return
			}
			http.Error(w, "the receipt could not be recorded", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}
