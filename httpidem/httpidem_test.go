package httpidem_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/storetest"
)

// app is a handler that counts executions and answers with the body it got.
type app struct {
	runs    atomic.Int32
	status  int
	panics  bool
	entered chan struct{} // if set, told when a run starts
	release chan struct{} // if set, every run waits for it
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.runs.Add(1)
	if a.entered != nil {
		a.entered <- struct{}{}
	}
	if a.release != nil {
		<-a.release
	}
	if a.panics {
		panic("handler bug")
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Run", fmt.Sprint(n))
	w.Header().Set("Connection", "keep-alive")
	status := a.status
	if status == 0 {
		status = http.StatusCreated
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"run":%d,"echo":%q}`, n, body)
}

func serve(t *testing.T, h http.Handler, cfg httpidem.Config) *httptest.Server {
	t.Helper()
	if cfg.Principal == nil {
		cfg.Principal = sharedAnonymous
	}
	if cfg.Store == nil && cfg.Guard == nil {
		s := memstore.New(memstore.Config{})
		t.Cleanup(func() { s.Close() })
		cfg.Store = s
	}
	mw, err := httpidem.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	return srv
}

// sharedAnonymous is DefaultPrincipal with one shared scope, "anonymous",
// for requests without credentials: the tests that are not about
// principals send their keys without any.
func sharedAnonymous(r *http.Request) string {
	if p := httpidem.DefaultPrincipal(r); p != "" {
		return p
	}
	return "anonymous"
}

type reply struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, srv *httptest.Server, method, key, auth, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+"/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func TestReplay(t *testing.T) {
	a := &app{}
	srv := serve(t, a, httpidem.Config{})
	first := do(t, srv, "POST", `"k-1"`, "", "amount=10")
	if first.status != 201 || first.header.Get(httpidem.ReplayedHeader) != "" || first.header.Get(httpidem.ExpiresHeader) == "" {
		t.Fatalf("first: %+v", first)
	}
	second := do(t, srv, "POST", `k-1`, "", "amount=10") // bare token: the same key
	if second.status != 201 || second.body != first.body || second.header.Get(httpidem.ReplayedHeader) != "true" {
		t.Fatalf("replay: %+v (first %+v)", second, first)
	}
	if second.header.Get("X-Run") != "1" || second.header.Get("Content-Type") != "application/json" {
		t.Fatalf("replayed headers: %v", second.header)
	}
	if second.header.Get(httpidem.ExpiresHeader) == "" {
		t.Fatal("replay does not advertise the retention")
	}
	if a.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", a.runs.Load())
	}
}

func TestMethods(t *testing.T) {
	a := &app{}
	srv := serve(t, a, httpidem.Config{})
	for range 2 {
		if r := do(t, srv, "GET", `"k"`, "", ""); r.header.Get(httpidem.ReplayedHeader) != "" {
			t.Fatal("GET was replayed")
		}
		if r := do(t, srv, "PUT", `"k"`, "", ""); r.header.Get(httpidem.ReplayedHeader) != "" {
			t.Fatal("PUT was replayed")
		}
	}
	do(t, srv, "PATCH", `"k"`, "", "")
	if r := do(t, srv, "PATCH", `"k"`, "", ""); r.header.Get(httpidem.ReplayedHeader) != "true" {
		t.Fatal("PATCH not replayed")
	}
	if a.runs.Load() != 5 {
		t.Fatalf("runs %d, want 5", a.runs.Load())
	}
}

func problemType(t *testing.T, r reply) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d with Content-Type %q, want application/problem+json: %s", r.status, ct, r.body)
	}
	var p struct {
		Type   string
		Status int
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.Status != r.status {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	return p.Type
}

func TestBadKeys(t *testing.T) {
	a := &app{}
	srv := serve(t, a, httpidem.Config{ProblemTypeBase: "https://docs.example/errors#"})
	for _, key := range []string{`""`, `"unterminated`, `"a" ; p=1`, `two words`, `"a", "b"`, `"` + strings.Repeat("k", 256) + `"`, strings.Repeat("k", 10<<10)} {
		r := do(t, srv, "POST", key, "", "")
		if r.status != 400 {
			t.Errorf("key %.20q: status %d, want 400", key, r.status)
			continue
		}
		if typ := problemType(t, r); typ != "https://docs.example/errors#malformed-key" {
			t.Errorf("type %q", typ)
		}
	}
	req, _ := http.NewRequest("POST", srv.URL, nil)
	req.Header.Add("Idempotency-Key", `"a"`)
	req.Header.Add("Idempotency-Key", `"b"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("two headers: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if a.runs.Load() != 0 {
		t.Fatalf("a bad key ran the handler %d times", a.runs.Load())
	}
	// Missing key: passes through unless required.
	if r := do(t, srv, "POST", "", "", ""); r.status != 201 {
		t.Fatalf("missing key: %d", r.status)
	}
	strict := serve(t, a, httpidem.Config{RequireKey: true})
	if r := do(t, strict, "POST", "", "", ""); r.status != 400 || !strings.HasSuffix(problemType(t, r), "#missing-key") {
		t.Fatalf("required key: %+v", r)
	}
}

func TestPrincipalsAreIsolated(t *testing.T) {
	a := &app{}
	srv := serve(t, a, httpidem.Config{})
	alice := do(t, srv, "POST", `"same"`, "Bearer alice", "secret of alice")
	bob := do(t, srv, "POST", `"same"`, "Bearer bob", "secret of alice")
	if bob.header.Get(httpidem.ReplayedHeader) != "" || strings.Contains(bob.body, `"run":1`) {
		t.Fatalf("bob received alice's response: %+v", bob)
	}
	if again := do(t, srv, "POST", `"same"`, "Bearer alice", "secret of alice"); again.body != alice.body {
		t.Fatalf("alice's replay: %+v", again)
	}
	if a.runs.Load() != 2 {
		t.Fatalf("runs %d, want 2", a.runs.Load())
	}
}

func TestMismatch(t *testing.T) {
	a := &app{}
	srv := serve(t, a, httpidem.Config{})
	do(t, srv, "POST", `"k"`, "", "amount=10")
	r := do(t, srv, "POST", `"k"`, "", "amount=9999")
	if r.status != 422 || !strings.HasSuffix(problemType(t, r), "#mismatch") {
		t.Fatalf("other payload: %+v", r)
	}
	if a.runs.Load() != 1 {
		t.Fatalf("runs %d", a.runs.Load())
	}
}

func TestConflictWhileInFlight(t *testing.T) {
	a := &app{entered: make(chan struct{}, 1), release: make(chan struct{})}
	srv := serve(t, a, httpidem.Config{})
	done := make(chan reply)
	go func() { done <- do(t, srv, "POST", `"slow"`, "", "") }()
	<-a.entered // the first request is running
	r := do(t, srv, "POST", `"slow"`, "", "")
	close(a.release)
	if r.status != 409 || r.header.Get("Retry-After") == "" || !strings.HasSuffix(problemType(t, r), "#conflict") {
		t.Fatalf("duplicate in flight: %+v", r)
	}
	if first := <-done; first.status != 201 {
		t.Fatalf("first: %+v", first)
	}
}

func TestOutcomePolicy(t *testing.T) {
	tests := []struct {
		status int
		rerun  bool
	}{
		{200, false}, {201, false}, {303, false}, {400, false}, {404, false}, {422, false},
		{408, true}, {409, true}, {425, true}, {429, true}, {500, true}, {503, true},
	}
	for _, tt := range tests {
		a := &app{status: tt.status}
		srv := serve(t, a, httpidem.Config{})
		do(t, srv, "POST", `"k"`, "", "")
		r := do(t, srv, "POST", `"k"`, "", "")
		rerun := a.runs.Load() == 2
		if rerun != tt.rerun {
			t.Errorf("status %d: second request ran the handler = %v, want %v", tt.status, rerun, tt.rerun)
		}
		if !tt.rerun && (r.status != tt.status || r.header.Get(httpidem.ReplayedHeader) != "true") {
			t.Errorf("status %d: replay %+v", tt.status, r)
		}
	}
}

func TestHoldOnBadGatewayTimeoutAndPanic(t *testing.T) {
	for _, a := range []*app{{status: 502}, {status: 504}, {panics: true}} {
		clock := storetest.NewManualClock(time.Now())
		store := memstore.New(memstore.Config{Clock: clock})
		t.Cleanup(func() { store.Close() })
		srv := serve(t, a, httpidem.Config{Store: store, Lease: 1500 * time.Millisecond})
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic is expected
		req, _ := http.NewRequest("POST", srv.URL+"/payments", nil)
		req.Header.Set("Idempotency-Key", `"k"`)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		// Held: the retry is told to wait while the lease lives…
		if r := do(t, srv, "POST", `"k"`, "", ""); r.status != 409 {
			t.Fatalf("retry right after an ambiguous outcome: %d, want 409", r.status)
		}
		// …and runs again once it expired (on the store's clock).
		clock.Advance(1800 * time.Millisecond)
		req, _ = http.NewRequest("POST", srv.URL+"/payments", nil)
		req.Header.Set("Idempotency-Key", `"k"`)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		if a.runs.Load() != 2 {
			t.Fatalf("runs %d, want 2 (the first, then a takeover)", a.runs.Load())
		}
	}
}

func TestBodyLimits(t *testing.T) {
	a := &app{}
	srv := serve(t, a, httpidem.Config{MaxBodyBytes: 100})
	big := strings.Repeat("x", 101)
	if r := do(t, srv, "POST", `"k"`, "", big); r.status != 413 || !strings.HasSuffix(problemType(t, r), "#body-too-large") {
		t.Fatalf("oversized body: %+v", r)
	}
	pass := serve(t, a, httpidem.Config{MaxBodyBytes: 100, Oversized: httpidem.PassOversized})
	r1 := do(t, pass, "POST", `"k"`, "", big)
	r2 := do(t, pass, "POST", `"k"`, "", big)
	if r1.status != 201 || r2.header.Get(httpidem.ReplayedHeader) != "" || !strings.Contains(r1.body, big) {
		t.Fatalf("oversized pass-through: %+v / %+v", r1, r2)
	}
	// A response over the storable limit is sent whole; the request ran, so
	// the retry does not run it again: it is replayed the status and
	// headers, with the body omitted and said to be.
	a2 := &app{}
	small := serve(t, a2, httpidem.Config{MaxResponseBytes: 10})
	first := do(t, small, "POST", `"k"`, "", "0123456789")
	if first.status != 201 || !strings.Contains(first.body, "0123456789") || first.header.Get(httpidem.BodyOmittedHeader) != "" {
		t.Fatalf("large response: %+v", first)
	}
	retry := do(t, small, "POST", `"k"`, "", "0123456789")
	if n := a2.runs.Load(); n != 1 {
		t.Fatalf("a request whose response was too large to store ran %d times", n)
	}
	if retry.status != 201 || retry.body != "" || retry.header.Get(httpidem.ReplayedHeader) != "true" ||
		retry.header.Get(httpidem.BodyOmittedHeader) != "too-large" || retry.header.Get("X-Run") != "1" ||
		retry.header.Get(httpidem.ExpiresHeader) == "" {
		t.Fatalf("the retry of a request whose response was too large to store: %+v", retry)
	}
}

func TestStorm(t *testing.T) {
	// The handler runs until every other request has been answered: all
	// 49 duplicates arrive while it is in flight.
	a := &app{release: make(chan struct{})}
	srv := serve(t, a, httpidem.Config{})
	var wg sync.WaitGroup
	var ok, conflict atomic.Int32
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch r := do(t, srv, "POST", `"storm"`, "Bearer x", "pay"); r.status {
			case 201:
				ok.Add(1)
			case 409:
				if conflict.Add(1) == 49 {
					close(a.release)
				}
			default:
				t.Errorf("status %d", r.status)
			}
		}()
	}
	wg.Wait()
	if a.runs.Load() != 1 {
		t.Fatalf("50 concurrent identical requests ran the handler %d times", a.runs.Load())
	}
	if ok.Load() != 1 || conflict.Load() != 49 {
		t.Fatalf("%d answered 201 and %d 409, want 1 and 49", ok.Load(), conflict.Load())
	}
}

func TestStreamingThroughRecorder(t *testing.T) {
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		io.WriteString(w, "first chunk\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("Flush through the recorder: %v", err)
		}
		<-release
		io.WriteString(w, "second chunk\n")
	})
	srv := serve(t, h, httpidem.Config{})
	req, _ := http.NewRequest("POST", srv.URL+"/payments", nil)
	req.Header.Set("Idempotency-Key", `"stream"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 12)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first chunk\n" {
		t.Fatalf("first chunk before the handler finished: %q %v", buf, err)
	}
	close(release)
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(rest) != "second chunk\n" {
		t.Fatalf("rest %q", rest)
	}
	if r := do(t, srv, "POST", `"stream"`, "", ""); r.body != "first chunk\nsecond chunk\n" {
		t.Fatalf("replayed stream %q", r.body)
	}
}

func TestStoreUnavailableFailsClosed(t *testing.T) {
	s := memstore.New(memstore.Config{})
	s.Close()
	a := &app{}
	srv := serve(t, a, httpidem.Config{Store: unavailable{s}})
	r := do(t, srv, "POST", `"k"`, "", "")
	if r.status != 503 || !strings.HasSuffix(problemType(t, r), "#store-unavailable") || a.runs.Load() != 0 {
		t.Fatalf("store down: %+v, runs %d", r, a.runs.Load())
	}
}

func TestFingerprintIncludesBody(t *testing.T) {
	var seen bytes.Buffer
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(&seen, r.Body)
		w.WriteHeader(200)
	})
	srv := serve(t, h, httpidem.Config{})
	do(t, srv, "POST", `"k"`, "", "the body")
	if seen.String() != "the body" {
		t.Fatalf("the handler saw %q: the middleware consumed the body", seen.String())
	}
}
