package httpidem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/store/memstore"
)

// TestHandlerOutlivesItsClientByFinishTimeout: a client leaves while its
// keyed request's handler waits on its context. The handler is cancelled
// FinishTimeout after the client left — not at once — and the request's
// key is held (the work may have happened: a retry is told 409). A handler
// that returns before then keeps its context until it returns, which is
// cancelled after.
func TestHandlerOutlivesItsClientByFinishTimeout(t *testing.T) {
	const finish = 100 * time.Millisecond
	s := memstore.New(memstore.Config{})
	defer s.Close()
	events := make(chan httpidem.Event, 4)
	entered := make(chan context.Context, 2)
	cancelledAfter := make(chan time.Duration, 1)
	var left time.Time
	mw, err := httpidem.New(httpidem.Config{Store: s, FinishTimeout: finish, Observer: func(e httpidem.Event) { events <- e }})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- r.Context()
		if r.Header.Get("Wait") == "" {
			w.WriteHeader(http.StatusCreated)
			return
		}
		<-r.Context().Done()
		cancelledAfter <- time.Since(left)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	send := func(ctx context.Context, key string, wait bool) int {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/payments", strings.NewReader("amount=10"))
		req.Header.Set(httpidem.HeaderName, key)
		req.Header.Set("Authorization", "Bearer alice")
		if wait {
			req.Header.Set("Wait", "1")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}

	client, leave := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); send(client, `"k-1"`, true) }()
	hctx := <-entered
	if err := hctx.Err(); err != nil {
		t.Fatalf("the handler's context while its client waits: %v", err)
	}
	left = time.Now()
	leave()
	<-served
	if d := <-cancelledAfter; d < finish {
		t.Fatalf("the handler was cancelled %v after its client left; want FinishTimeout (%v) or later", d, finish)
	}
	if e := <-events; e.Outcome != "executed" || e.Status != http.StatusServiceUnavailable {
		t.Fatalf("the event: %+v; want executed, 503", e)
	}
	// The key is held (the work may have happened): a retry is told so.
	if code := send(context.Background(), `"k-1"`, false); code != http.StatusConflict {
		t.Fatalf("a retry of the cancelled request: %d; want 409 (its key held)", code)
	}
	<-events

	send(context.Background(), `"k-2"`, false)
	if hctx := <-entered; !errors.Is(hctx.Err(), context.Canceled) {
		t.Fatalf("a finished handler's context after the request: %v; want Canceled", hctx.Err())
	}
	<-events
}
