package httpidem_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/storetest"
)

// postAndGiveUp sends a request whose client gives up after it reached the
// handler (entered).
func postAndGiveUp(t *testing.T, url, key string, entered <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/payments", strings.NewReader("pay 10"))
	req.Header.Set("Idempotency-Key", key)
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-entered
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the client got an answer before it gave up")
	}
}

// TestHandlerFinishesAfterClientLeft: the client gives up while the handler
// runs. The handler is not cancelled by it; the key's lease is kept while it
// runs (three leases long here), retries get 409, and once the handler
// answers, its answer is stored and replayed. The handler runs once.
func TestHandlerFinishesAfterClientLeft(t *testing.T) {
	clock := storetest.NewManualClock(time.Unix(1_800_000_000, 0))
	store := memstore.New(memstore.Config{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	beats := make(chan error, 1000)
	entered, finish := make(chan struct{}, 10), make(chan struct{})
	var runs, cancelled int32
	var mu sync.Mutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs++
		n := runs
		mu.Unlock()
		entered <- struct{}{}
		select {
		case <-finish:
		case <-r.Context().Done():
			mu.Lock()
			cancelled++
			mu.Unlock()
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %d", n)
	})
	srv := serve(t, h, httpidem.Config{Store: store, Lease: time.Second,
		StoreObserver: func(e idem.Event) {
			if e.Phase == "heartbeat" {
				beats <- e.Err
			}
		}})
	postAndGiveUp(t, srv.URL, `"gone"`, entered)
	for range 3 {
		clock.Advance(800 * time.Millisecond)
		for len(beats) > 0 {
			<-beats
		}
		deadline := time.After(10 * time.Second)
	wait:
		for {
			select {
			case err := <-beats:
				if err == nil {
					break wait
				}
			case <-deadline:
				t.Fatal("no heartbeat succeeded after the client left: the lease lapses while the handler runs")
			}
		}
		if r := do(t, srv, "POST", `"gone"`, "", "pay 10"); r.status != http.StatusConflict {
			t.Fatalf("retry while the handler still runs: %d %s, want 409", r.status, r.body)
		}
	}
	close(finish)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := do(t, srv, "POST", `"gone"`, "", "pay 10")
		if r.status == http.StatusConflict && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // the handler is storing its answer
			continue
		}
		if r.status != http.StatusCreated || r.body != "payment 1" || r.header.Get(httpidem.ReplayedHeader) != "true" {
			t.Fatalf("retry after the handler finished: %d %q %v", r.status, r.body, r.header)
		}
		break
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 || cancelled != 0 {
		t.Fatalf("handler ran %d times, was cancelled %d times; want once, never cancelled", runs, cancelled)
	}
}

// TestCookieUsersAreIsolated: without Authorization, callers authenticated by
// cookies are different principals: the same key and body from another
// session is executed for it, never answered with the first one's response.
func TestCookieUsersAreIsolated(t *testing.T) {
	a := &app{}
	srv := serve(t, a, httpidem.Config{})
	post := func(cookie string) reply {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader("same body"))
		req.Header.Set("Idempotency-Key", `"same"`)
		req.Header.Set("Cookie", cookie)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = fmt.Fprint(&b, resp.Header.Get("X-Run"))
		return reply{status: resp.StatusCode, header: resp.Header, body: b.String()}
	}
	alice := post("session=alice")
	bob := post("session=bob")
	if bob.header.Get(httpidem.ReplayedHeader) != "" || bob.body == alice.body {
		t.Fatalf("bob (cookie session=bob) received alice's response: run %s, replayed %q", bob.body, bob.header.Get(httpidem.ReplayedHeader))
	}
	if again := post("session=alice"); again.header.Get(httpidem.ReplayedHeader) != "true" || again.body != alice.body {
		t.Fatalf("alice's retry was not replayed: %+v", again)
	}
}

// TestSetCookieNeverReplayed: a stored response is replayed without the
// first response's Set-Cookie (a session handed to whoever retries), unless
// StoreSetCookie says otherwise.
func TestSetCookieNeverReplayed(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "s3cr3t"})
		w.WriteHeader(http.StatusCreated)
	})
	for _, keep := range []bool{false, true} {
		srv := serve(t, h, httpidem.Config{StoreSetCookie: keep})
		first := do(t, srv, "POST", `"k"`, "Bearer u", "")
		if first.header.Get("Set-Cookie") == "" {
			t.Fatal("the first response lost its Set-Cookie")
		}
		replay := do(t, srv, "POST", `"k"`, "Bearer u", "")
		if replay.header.Get(httpidem.ReplayedHeader) != "true" {
			t.Fatalf("not replayed: %+v", replay)
		}
		if got := replay.header.Get("Set-Cookie") != ""; got != keep {
			t.Errorf("StoreSetCookie=%v: replay has Set-Cookie %q", keep, replay.header.Get("Set-Cookie"))
		}
	}
}

// TestPrincipalChoices: a principal from a header set by an auth proxy, from
// one cookie, or none at all.
func TestPrincipalChoices(t *testing.T) {
	for _, tt := range []struct {
		spec        string
		alice, bob  func(*http.Request)
		sameAnswers bool
	}{
		{"header:X-User-Id", func(r *http.Request) { r.Header.Set("X-User-Id", "alice") }, func(r *http.Request) { r.Header.Set("X-User-Id", "bob") }, false},
		{"cookie:session", func(r *http.Request) { r.Header.Set("Cookie", "session=alice; _ga=1") }, func(r *http.Request) { r.Header.Set("Cookie", "session=bob; _ga=1") }, false},
		{"cookie:session", func(r *http.Request) { r.Header.Set("Cookie", "session=alice; _ga=1") }, func(r *http.Request) { r.Header.Set("Cookie", "_ga=2; session=alice") }, true},
		{"none", func(r *http.Request) { r.Header.Set("Authorization", "Bearer a") }, func(r *http.Request) { r.Header.Set("Authorization", "Bearer b") }, true},
	} {
		p, err := httpidem.ParsePrincipal(tt.spec)
		if err != nil {
			t.Fatal(err)
		}
		a := &app{}
		srv := serve(t, a, httpidem.Config{Principal: p})
		post := func(set func(*http.Request)) string {
			req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader("b"))
			req.Header.Set("Idempotency-Key", `"k"`)
			set(req)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.Header.Get("X-Run")
		}
		if same := post(tt.alice) == post(tt.bob); same != tt.sameAnswers {
			t.Errorf("%s: second caller got the first one's answer = %v, want %v", tt.spec, same, tt.sameAnswers)
		}
	}
	for _, bad := range []string{"", "header:", "cookie:", "jwt:sub", "header:Bad Name"} {
		if _, err := httpidem.ParsePrincipal(bad); err == nil {
			t.Errorf("ParsePrincipal(%q): no error", bad)
		}
	}
}
