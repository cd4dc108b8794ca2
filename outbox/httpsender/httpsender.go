// Package httpsender delivers outbox messages over HTTP: a POST of the
// payload with the key in the Idempotency-Key header (an sf-string, as the
// IETF draft and idem's httpidem expect), the same bytes on every attempt.
package httpsender

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/internal/keyheader"
	"github.com/idemgo/idem/internal/redirect"
	"github.com/idemgo/idem/outbox"
)

// Config configures the HTTP sender.
type Config struct {
	// Client sends the requests. Defaults to a client with Timeout.
	Client *http.Client
	// Timeout bounds one request when Client is nil. Defaults to 30s.
	Timeout time.Duration
	// ContentType of the payload unless the message sets Content-Type.
	// Defaults to application/octet-stream.
	ContentType string
	// HostHeaders are headers set on every request to a host — its
	// credentials (Authorization, an API key), which then need not be
	// written into every outbox row. The key is the destination URL's host,
	// HOST:PORT when it names a port (as url.URL.Host has it); they are set
	// after the message's own headers, so they win.
	HostHeaders map[string]http.Header
	// RedirectSameHost follows a redirect to the destination's own scheme,
	// host and port. By default no redirect is followed: the 3xx is the
	// answer, recorded, and the message is tried again later. A redirect
	// to another host is never followed, so the message and the host's
	// headers go nowhere but where the row says.
	RedirectSameHost bool
}

// Sender POSTs the payload with the key in Idempotency-Key:
// 2xx → acked (the answer is the receipt); 409 → retry later (the receiver
// is still processing our earlier attempt); other 4xx → dead, with the
// answer recorded; 5xx, timeouts and network errors → retry; a redirect is
// not followed (Config.RedirectSameHost) and is retried later, recorded.
type Sender struct{ cfg Config }

// New returns the HTTP sender.
func New(cfg Config) *Sender {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if cfg.RedirectSameHost {
		cfg.Client = redirect.SameHost(cfg.Client)
	} else {
		cfg.Client = redirect.Never(cfg.Client)
	}
	if cfg.ContentType == "" {
		cfg.ContentType = "application/octet-stream"
	}
	return &Sender{cfg: cfg}
}

// Client is the client the sender posts with.
func (h *Sender) Client() *http.Client { return h.cfg.Client }

// Send implements outbox.Sender.
func (h *Sender) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.Destination, bytes.NewReader(m.Payload))
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("bad destination: %v", err)}
	}
	req.Header.Set("Content-Type", h.cfg.ContentType)
	for k, v := range m.Headers {
		req.Header.Set(k, v)
	}
	for k, v := range h.cfg.HostHeaders[req.URL.Host] {
		req.Header[http.CanonicalHeaderKey(k)] = v
	}
	req.Header.Set(httpidem.HeaderName, keyheader.Format(m.Key))
	if m.OrderingKey != "" {
		req.Header.Set(outbox.OrderingKeyHeader, m.OrderingKey)
	}
	resp, err := h.cfg.Client.Do(req)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("timeout (the receiver may have it; the retry carries the same key): %v", err)}
		}
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	answer := fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(snippet)))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		if resp.Header.Get(httpidem.ReplayedHeader) == "true" {
			return outbox.Result{Status: outbox.Acked, Err: errors.New("the receiver replayed its answer: delivered earlier")}
		}
		return outbox.Result{Status: outbox.Acked}
	case resp.StatusCode == http.StatusConflict, resp.StatusCode == http.StatusTooManyRequests,
		resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode == http.StatusTooEarly, resp.StatusCode >= 500:
		return outbox.Result{Status: outbox.Pending, Err: errors.New(answer)}
	case resp.StatusCode >= 400:
		return outbox.Result{Status: outbox.Dead, Err: errors.New(answer)}
	}
	if loc := resp.Header.Get("Location"); resp.StatusCode >= 300 && loc != "" {
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("redirected to %q, not followed: %s", loc, answer)}
	}
	return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("unexpected answer %s", answer)}
}
