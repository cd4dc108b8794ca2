package httpidem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemgo/idem/internal/ctxsleep"
	"github.com/idemgo/idem/internal/keyheader"
)

// Transport is an http.RoundTripper for the client side of the
// Idempotency-Key header: each logical request gets one key — the one its
// caller set, or a new one for a POST or a PATCH — and every retry sends
// that key again, so a server that deduplicates by it (idem serve, the
// middleware) runs the request once however often the network fails.
//
// A request that carries a key and whose body can be read again
// (http.NewRequest sets GetBody for a bytes, a strings or a bytes.Buffer
// reader) is retried, with exponential backoff and full jitter, after a
// connection error, a 409 (the key is in flight: after its Retry-After), a
// 429 (after its Retry-After) or a 5xx; every other request is sent once.
// The last answer is returned; Replayed tells whether it came from the
// server's store.
type Transport struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// NewKey makes a key for a POST or PATCH without one. Defaults to a
	// UUIDv7.
	NewKey func() (string, error)
	// MaxAttempts bounds the attempts of one request. Defaults to 5.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the wait between attempts (full
	// jitter, doubling from BackoffMin); a Retry-After the server sent —
	// seconds or an HTTP-date — wins, up to BackoffMax. Default to 100ms
	// and 5s.
	BackoffMin, BackoffMax time.Duration

	wait func(ctx context.Context, d time.Duration) error // tests: instead of sleeping
}

// Replayed reports whether resp was replayed from an idempotency store
// (the Idempotent-Replayed header) rather than produced by this request.
func Replayed(resp *http.Response) bool {
	return resp != nil && resp.Header.Get(ReplayedHeader) == "true"
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if req.Header.Get(HeaderName) == "" && (req.Method == http.MethodPost || req.Method == http.MethodPatch) {
		key, err := t.newKey()
		if err != nil {
			return nil, fmt.Errorf("idem/httpidem: a new key: %w", err)
		}
		req = req.Clone(req.Context()) // a RoundTripper must not change the caller's request
		req.Header.Set(HeaderName, keyheader.Format(key))
	}
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	if req.Header.Get(HeaderName) == "" || !replayable {
		return base.RoundTrip(req)
	}
	attempts := t.MaxAttempts
	if attempts <= 0 {
		attempts = 5
	}
	for attempt := 1; ; attempt++ {
		try := req
		if attempt > 1 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, fmt.Errorf("idem/httpidem: reading the body again: %w", err)
			}
			try = req.Clone(req.Context())
			try.Body = body
		}
		resp, err := base.RoundTrip(try)
		wait, again := t.retry(resp, err, attempt)
		if !again || attempt >= attempts {
			return resp, err
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		pause := ctxsleep.Sleep
		if t.wait != nil {
			pause = t.wait
		}
		if err := pause(req.Context(), wait); err != nil {
			return nil, err
		}
	}
}

func (t *Transport) newKey() (string, error) {
	if t.NewKey != nil {
		return t.NewKey()
	}
	u, err := uuid.NewV7()
	return u.String(), err
}

// retry says whether an attempt's outcome is worth another attempt with
// the same key, and after how long.
func (t *Transport) retry(resp *http.Response, err error, attempt int) (time.Duration, bool) {
	lo, hi := t.BackoffMin, t.BackoffMax
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi <= 0 {
		hi = 5 * time.Second
	}
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return 0, false
		}
		return backoff(lo, hi, attempt), true
	}
	switch {
	case resp.StatusCode == http.StatusConflict, resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode >= 500:
	default:
		return 0, false
	}
	// Retry-After is seconds or an HTTP-date (RFC 9110 §10.2.3).
	ra := resp.Header.Get("Retry-After")
	if s, err := strconv.Atoi(ra); err == nil && s >= 0 {
		return min(time.Duration(s)*time.Second, hi), true
	}
	if at, err := http.ParseTime(ra); err == nil {
		return min(max(time.Until(at), 0), hi), true
	}
	return backoff(lo, hi, attempt), true
}

// backoff is uniform in [0, min(hi, lo·2^(attempt-1))].
func backoff(lo, hi time.Duration, attempt int) time.Duration {
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	return time.Duration(rand.Int64N(int64(min(d, hi)) + 1))
}
