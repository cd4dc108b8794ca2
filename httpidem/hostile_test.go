package httpidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/store/memstore"
)

// apiKeyApp is a service that authenticates callers by X-Api-Key (not
// Authorization): it answers 401 without one.
type apiKeyApp struct{ app }

func (a *apiKeyApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Api-Key") == "" {
		http.Error(w, "who are you?", http.StatusUnauthorized)
		return
	}
	a.app.ServeHTTP(w, r)
}

// TestNoPrincipalNoReplay: by default a keyed request from which no
// principal can be derived is neither stored nor replayed: a caller with no
// credentials who sends alice's key and body reaches the service (401) and
// learns nothing of alice's request, not even that the key exists. Naming
// the header the service authenticates with scopes alice; a shared scope
// for callers without credentials is there only when asked for
// (NoPrincipal).
func TestNoPrincipalNoReplay(t *testing.T) {
	send := func(srv *httptest.Server, apiKey, body string) reply {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", `"order-1001"`)
		if apiKey != "" {
			req.Header.Set("X-Api-Key", apiKey)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return reply{status: resp.StatusCode, header: resp.Header}
	}
	var events []httpidem.Event
	a := &apiKeyApp{}
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	mw, err := httpidem.New(httpidem.Config{Store: s, Observer: func(e httpidem.Event) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(a))
	t.Cleanup(srv.Close)
	if r := send(srv, "alice", "pay 10"); r.status != http.StatusCreated {
		t.Fatalf("alice: %d", r.status)
	}
	for _, body := range []string{"pay 10", "pay 99"} {
		if r := send(srv, "", body); r.status != http.StatusUnauthorized || r.header.Get(httpidem.ReplayedHeader) != "" {
			t.Fatalf("no credentials, body %q: %d replayed=%q; want the service's 401", body, r.status, r.header.Get(httpidem.ReplayedHeader))
		}
	}
	if r := send(srv, "alice", "pay 10"); r.status != http.StatusCreated || a.runs.Load() != 2 {
		t.Fatalf("alice again without a principal: %d after %d runs; want a second run (nothing stored)", r.status, a.runs.Load())
	}
	unscoped := 0
	for _, e := range events {
		if e.Outcome == "unscoped" {
			unscoped++
		}
	}
	if unscoped != 4 {
		t.Fatalf("%d unscoped events, want 4: %+v", unscoped, events)
	}

	// The service's own header named: alice is scoped and replayed, a
	// caller without it passes through.
	b := &apiKeyApp{}
	named := serve(t, b, httpidem.Config{Principal: httpidem.HeaderPrincipal("X-Api-Key")})
	send(named, "alice", "pay 10")
	if r := send(named, "alice", "pay 10"); r.header.Get(httpidem.ReplayedHeader) != "true" {
		t.Fatalf("alice's retry was not replayed: %d", r.status)
	}
	if r := send(named, "", "pay 10"); r.status != http.StatusUnauthorized {
		t.Fatalf("no credentials: %d", r.status)
	}
	if r := send(named, "mallory", "pay 99"); r.status != http.StatusCreated || b.runs.Load() != 2 {
		t.Fatalf("another principal under alice's key: %d after %d runs", r.status, b.runs.Load())
	}

	// A shared scope, asked for.
	c := &apiKeyApp{}
	shared := serve(t, c, httpidem.Config{Principal: httpidem.NoPrincipal})
	send(shared, "alice", "pay 10")
	if r := send(shared, "bob", "pay 10"); r.header.Get(httpidem.ReplayedHeader) != "true" {
		t.Fatalf("NoPrincipal does not share: %d", r.status)
	}
}

// TestHugeResponseHeadersSettle: a response with ~1.2 MB of headers cannot
// be stored whole; it is settled at once, stored without its headers
// (HeadersOmittedHeader says so), so a retry is replayed its status
// instead of 409 until the lease runs out and a second run.
func TestHugeResponseHeadersSettle(t *testing.T) {
	runs := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		for i := range 1200 {
			w.Header().Set(fmt.Sprintf("X-Big-%d", i), strings.Repeat("v", 1000))
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "created")
	})
	srv := serve(t, h, httpidem.Config{})
	first := do(t, srv, "POST", `"big"`, "Bearer u", "x")
	if first.status != http.StatusCreated || first.header.Get("X-Big-7") == "" {
		t.Fatalf("first: %d", first.status)
	}
	again := do(t, srv, "POST", `"big"`, "Bearer u", "x")
	if again.status != http.StatusCreated || again.header.Get(httpidem.ReplayedHeader) != "true" || again.header.Get(httpidem.HeadersOmittedHeader) == "" || runs != 1 {
		t.Fatalf("retry: %d replayed=%q omitted=%q after %d runs", again.status, again.header.Get(httpidem.ReplayedHeader), again.header.Get(httpidem.HeadersOmittedHeader), runs)
	}
}

// TestUnknownMethodWithKeyRefused: methods are case-sensitive, so "post"
// is not POST; with a key it is refused (501) rather than run without
// protection; without a key it passes through.
func TestUnknownMethodWithKeyRefused(t *testing.T) {
	a := &app{}
	srv := serve(t, a, httpidem.Config{})
	for range 3 {
		if r := do(t, srv, "post", `"k"`, "Bearer u", "x"); r.status != http.StatusNotImplemented {
			t.Fatalf("a keyed lowercase post: %d", r.status)
		}
	}
	if a.runs.Load() != 0 {
		t.Fatalf("ran %d times", a.runs.Load())
	}
	if r := do(t, srv, "post", "", "Bearer u", "x"); r.status != http.StatusCreated {
		t.Fatalf("an unkeyed lowercase post: %d", r.status)
	}
	if r := do(t, srv, "PUT", `"k"`, "Bearer u", "x"); r.status != http.StatusCreated {
		t.Fatalf("a keyed PUT (known, not guarded): %d", r.status)
	}
}
