// Package as2sender delivers EDI interchanges AS2-style over HTTP, with a
// Message-ID derived from the key, the same on every attempt.
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

	"github.com/idemgo/idem/edi"
	"github.com/idemgo/idem/internal/redirect"
	"github.com/idemgo/idem/outbox"
)

// Sender posts EDI interchanges AS2-style over HTTP: destination
// as2+https://HOST/PATH?from=OUR-AS2-ID&to=THEIR-AS2-ID&host=OUR-HOST (or
// as2+http://). Headers: Message-ID derived from the key
// (edi.AS2MessageID, the same on every attempt), AS2-From, AS2-To,
// AS2-Version 1.2, Content-Type application/EDIFACT or application/EDI-X12,
// and the Date stored with the message (an AS2 Message-ID may be reused only
// with identical content and Date, RFC 4130 §5.5).
//
// Not implemented yet: S/MIME signing and encryption, and signed MDNs. A
// synchronous MDN saying "processed" marks the message acked; "failed" makes
// it dead; otherwise it is sent, and Outbox.Ack records the receipt when an
// asynchronous MDN arrives.
type Sender struct{ client *http.Client }

// New returns the AS2 sender, posting with client (nil: a client with a
// 30-second timeout). It follows no redirect: a 3xx is the answer, and the
// message is dead with it recorded.
func New(client *http.Client) *Sender {
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	client = redirect.Never(client) // an AS2 message goes to the agreed URL only
	return &Sender{client: client}
}

// Send implements outbox.Sender.
func (a *Sender) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	u, err := url.Parse(strings.TrimPrefix(m.Destination, "as2+"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("want as2+https://HOST/PATH?from=…&to=…, got %q", m.Destination)}
	}
	q := u.Query()
	from, to, host := q.Get("from"), q.Get("to"), q.Get("host")
	if from == "" || to == "" {
		return outbox.Result{Status: outbox.Dead, Err: errors.New("the AS2 destination needs from= and to=")}
	}
	if host == "" {
		host = "idem.local"
	}
	for _, k := range []string{"from", "to", "host"} {
		q.Del(k)
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(m.Payload))
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
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
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Message-ID", edi.AS2MessageID(m.Key, host))
	req.Header.Set("AS2-From", quoteAS2(from))
	req.Header.Set("AS2-To", quoteAS2(to))
	req.Header.Set("AS2-Version", "1.2")
	req.Header.Set("Date", date)
	req.Header.Set("Disposition-Notification-To", "idem@"+host)
	copyTraceContext(req.Header, m)
	resp, err := a.client.Do(req)
	if err != nil {
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		mdn := strings.ToLower(string(body))
		switch {
		case strings.Contains(mdn, "disposition:") && strings.Contains(mdn, "processed"):
			return outbox.Result{Status: outbox.Acked}
		case strings.Contains(mdn, "disposition:") && strings.Contains(mdn, "failed"):
			return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("negative MDN: %s", strings.TrimSpace(string(body)))}
		}
		return outbox.Result{Status: outbox.Sent}
	case resp.StatusCode >= 500 || resp.StatusCode == 408 || resp.StatusCode == 409 || resp.StatusCode == 429:
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("%s", resp.Status)}
	}
	return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))}
}

// quoteAS2 quotes an AS2 name with spaces (RFC 4130 §6.2).
func quoteAS2(s string) string {
	if strings.ContainsAny(s, " \t") {
		return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
	}
	return s
}

// copyTraceContext passes the trace context the relay gave m (traceparent,
// tracestate: the send's span) on to the partner, so a traced receiver's
// spans join the sender's trace. The AS2 headers are the sender's own; no
// other header of the message is sent.
func copyTraceContext(h http.Header, m *outbox.Message) {
	for _, name := range []string{"traceparent", "tracestate"} {
		if v := m.Headers[name]; v != "" {
			h.Set(name, v)
		}
	}
}
