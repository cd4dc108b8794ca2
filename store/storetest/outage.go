package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// Outage proves that a store fails closed while its server is unreachable and
// recovers without being reopened: s must reach its server through a
// connection that cut takes away and restore gives back (a TCP proxy).
//
// While cut, every guarded call returns an error wrapping
// idem.ErrStoreUnavailable (or a deadline) and the work never runs; after
// restore, the same store serves again and replays what was done before the
// outage.
func Outage(t *testing.T, s store.Store, cut, restore func()) {
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
		if !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
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

// LeaseRunsOutInAnOutage proves that guarded work does not outlive its claim
// when the store becomes unreachable while the work runs — never two owners'
// work at once: s reaches its server through a connection that cut takes
// away and restore gives back (a TCP proxy); direct reaches the same records
// without it. Once the server is cut off, the work's heartbeats fail; its
// context must be cancelled, with cause idem.ErrLeaseExpired, before a
// request through direct can take the key over (the lease runs out on the
// server's clock, which the test cannot move: it asks again until then).
// After restore, the first owner's run ends without settling the record.
func LeaseRunsOutInAnOutage(t *testing.T, s, direct store.Store, cut, restore func()) {
	const lease = 2 * time.Second
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: lease, HeartbeatInterval: lease / 4})
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "outage", ID: fmt.Sprintf("lease-%d", time.Now().UnixNano())}
	started := make(chan context.Context, 1)
	finish := make(chan struct{})
	ran := make(chan error, 1)
	go func() {
		_, err := g.Run(context.Background(), key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
			started <- ctx
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-finish:
				return []byte("never cancelled"), nil
			}
		})
		ran <- err
	}()
	var work context.Context
	select {
	case work = <-started:
	case err := <-ran:
		t.Fatalf("the work did not start: %v", err)
	}
	cut()
	restored := false
	defer func() {
		if !restored {
			restore()
		}
		close(finish)
		<-ran
	}()
	TakeOverAfterTheLease(t, direct, store.AcquireRequest{Key: g.StorageKey(key), Lease: time.Minute, Retention: time.Hour}, work, lease)
	restore()
	restored = true
	if err := <-ran; !errors.Is(err, context.Canceled) || !errors.Is(err, idem.ErrLeaseExpired) {
		t.Fatalf("the first owner's run: %v, want the cancellation of its work and why", err)
	}
	ran <- nil // for the deferred wait
}

// TakeOverAfterTheLease asks direct to acquire req (the key of work cut off
// from its store) until it takes the key over, and fails t unless work's
// context was cancelled by then with cause idem.ErrLeaseExpired: never two
// owners' work at once. The lease runs out on the server's clock, which
// the caller cannot move, so it asks every lease/20, for up to 30 s.
func TakeOverAfterTheLease(t testing.TB, direct store.Store, req store.AcquireRequest, work context.Context, lease time.Duration) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := direct.Acquire(context.Background(), req)
		if err != nil {
			t.Fatalf("the direct store: %v", err)
		}
		if a.Outcome == store.TakenOver {
			if work.Err() == nil {
				t.Fatal("the key was taken over while its first owner's work still ran: its context was not cancelled when its lease ran out")
			}
			if cause := context.Cause(work); !errors.Is(cause, idem.ErrLeaseExpired) {
				t.Fatalf("the first owner's work was cancelled with cause %v, want ErrLeaseExpired", cause)
			}
			return
		}
		if a.Outcome != store.InProgress {
			t.Fatalf("while the first owner's lease runs: %v, want InProgress", a.Outcome)
		}
		if time.Now().After(deadline) {
			t.Fatal("the first owner's lease did not run out within 30 s of the outage")
		}
		time.Sleep(lease / 20)
	}
}

// SettleAcrossABlip proves that a store out of reach for a moment when the
// work has just finished does not leave the record in flight — to be run
// again by the next delivery once the lease ends (twice): the Guard tries
// the settle again, within the lease. s reaches its server through a
// connection that cut takes away and restore gives back; the work cuts it
// as it returns, and the first failed settle (seen by the Guard's
// observer) restores it. The run must then succeed, and the key replay.
func SettleAcrossABlip(t *testing.T, s store.Store, cut, restore func()) {
	var restored atomic.Bool
	defer func() {
		if restored.CompareAndSwap(false, true) {
			restore()
		}
	}()
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: 20 * time.Second, Observer: func(e idem.Event) {
		if e.Phase == "settle" && e.Err != nil && restored.CompareAndSwap(false, true) {
			restore()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "outage", ID: fmt.Sprintf("settle-%d", time.Now().UnixNano())}
	runs := 0
	work := func(ctx context.Context) (string, error) {
		runs++
		if runs == 1 {
			cut()
		}
		return "done", nil
	}
	ctx := context.Background()
	if v, err := idem.Do(ctx, g, key, work); err != nil || v != "done" {
		t.Fatalf("the run whose settle met the cut: %q, %v; want done and no error", v, err)
	}
	if !restored.Load() {
		t.Fatal("the settle never failed: the cut did not reach the store")
	}
	if v, err := idem.Do(ctx, g, key, work); err != nil || v != "done" || runs != 1 {
		t.Fatalf("after the blip: %q, %v, work ran %d times; want the replay of done, once", v, err, runs)
	}
}
