package storetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// Outage proves that a store fails closed while its server is unreachable and
// recovers without being reopened: s must reach its server through a
// connection that cut takes away and restore gives back (a TCP proxy).
//
// While cut, every guarded call returns an error wrapping
// idem.ErrStoreUnavailable (or a deadline) and the work never runs; after
// restore, the same store serves again and replays what was done before the
// outage.
func Outage(t *testing.T, s idem.Store, cut, restore func()) {
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	work := func(ctx context.Context) (string, error) { runs.Add(1); return "done", nil }
	call := func(id string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return idem.Do(ctx, g, idem.Key{Scope: "outage", ID: id}, work)
	}
	if _, err := call("before"); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	cut()
	for _, id := range []string{"during-1", "during-2", "before"} {
		start := time.Now()
		_, err := call(id)
		if err == nil {
			t.Fatalf("%s: a call succeeded with the server unreachable", id)
		}
		if !errors.Is(err, idem.ErrStoreUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: error %v, want ErrStoreUnavailable", id, err)
		}
		t.Logf("while unreachable (%v): %v", time.Since(start).Round(time.Millisecond), err)
	}
	if runs.Load() != 1 {
		t.Fatalf("work ran %d times; only the call before the outage may run it", runs.Load())
	}
	restore()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := call("after")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store did not recover after the server came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v, err := call("before"); err != nil || v != "done" {
		t.Fatalf("replay after the outage: %q %v", v, err)
	}
	if runs.Load() != 2 {
		t.Fatalf("work ran %d times, want 2 (before, after)", runs.Load())
	}
}
