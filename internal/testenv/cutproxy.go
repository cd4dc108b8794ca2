package testenv

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// CuttingProxy is an HTTP proxy in front of a target that drops the
// connection of the first request once the target has answered it: the
// request ran, and its client never learns how. It records the
// Idempotency-Key of every request it forwards.
type CuttingProxy struct {
	URL    string
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	keys   []string
}

// StartCuttingProxy starts a CuttingProxy in front of target (a base URL);
// it stops when t ends.
func StartCuttingProxy(t testing.TB, target string) *CuttingProxy {
	p := &CuttingProxy{target: target}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// Keys returns the Idempotency-Key of each request forwarded so far.
func (p *CuttingProxy) Keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys...)
}

func (p *CuttingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.keys = append(p.keys, r.Header.Get("Idempotency-Key"))
	p.mu.Unlock()
	out, _ := http.NewRequest(r.Method, p.target+r.URL.RequestURI(), r.Body)
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if p.cut.CompareAndSwap(false, true) {
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}
