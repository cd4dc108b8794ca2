package httpidem_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/store/memstore"
)

// TestConfiguredGuard: Config.Guard runs the requests on the application's
// own Guard — its cache, observer and retention apply — and the
// middleware's status policy still decides, whatever the Guard's Classify.
func TestConfiguredGuard(t *testing.T) {
	store := memstore.New(memstore.Config{})
	defer store.Close()
	var mu sync.Mutex
	phases := map[string]int{}
	g, err := idem.NewGuard(idem.Config{
		Store: store, Retention: 2 * time.Hour, CacheSize: 100,
		// A policy that would release everything: the middleware's own
		// decisions must win.
		Classify: func(error) idem.Disposition { return idem.Release },
		Observer: func(e idem.Event) { mu.Lock(); phases[e.Phase]++; mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	ok := &app{}
	srv := serve(t, ok, httpidem.Config{Guard: g})
	first := do(t, srv, "POST", `"g-1"`, "", "amount=10")
	second := do(t, srv, "POST", `"g-1"`, "", "amount=10")
	if ok.runs.Load() != 1 || second.header.Get(httpidem.ReplayedHeader) != "true" || second.body != first.body {
		t.Fatalf("the 201 was not stored and replayed: runs %d, second %+v", ok.runs.Load(), second)
	}
	expires, err := http.ParseTime(first.header.Get(httpidem.ExpiresHeader))
	if err != nil || time.Until(expires) < time.Hour {
		t.Fatalf("Expires %v (%v): not the Guard's 2h retention", expires, err)
	}
	third := do(t, srv, "POST", `"g-1"`, "", "amount=10")
	if third.body != first.body {
		t.Fatal("third call differs")
	}
	mu.Lock()
	if phases["acquire"] == 0 || phases["settle"] != 1 {
		t.Errorf("the Guard's observer heard %v", phases)
	}
	mu.Unlock()

	// A 503 is released by the middleware's policy: the retry runs again.
	down := &app{status: http.StatusServiceUnavailable}
	srv = serve(t, down, httpidem.Config{Guard: g})
	do(t, srv, "POST", `"g-2"`, "", "x")
	do(t, srv, "POST", `"g-2"`, "", "x")
	if down.runs.Load() != 2 {
		t.Fatalf("a released 503 ran %d times, want 2", down.runs.Load())
	}

	// A Guard and the fields it owns: refused, naming them.
	if _, err := httpidem.New(httpidem.Config{Guard: g, Lease: time.Minute}); err == nil {
		t.Fatal("Config.Guard with Config.Lease was accepted")
	}
	if _, err := httpidem.New(httpidem.Config{}); err == nil {
		t.Fatal("no Store and no Guard was accepted")
	}
}
