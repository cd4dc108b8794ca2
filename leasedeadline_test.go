package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// TestLeaseDeadlineBoundsTheClaim: a run with a LeaseDeadline takes a
// lease that ends there, however long Config.Lease is; its heartbeats
// never extend the claim past it; its work is told when it is reached; and
// the next caller takes the key over right after, not a Config.Lease
// later.
func TestLeaseDeadlineBoundsTheClaim(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: time.Minute, HeartbeatInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "lambda", ID: "MSG-1"}
	deadline := time.Now().Add(400 * time.Millisecond)
	var latest time.Time // the furthest the claim's lease reached while the work ran
	res, err := g.Run(context.Background(), key, &idem.RunOptions{LeaseDeadline: deadline}, func(ctx context.Context, _ uint64) ([]byte, error) {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil, ctx.Err() // as most work does: the claim is held
			case <-tick.C:
				rec, err := s.Get(context.Background(), g.StorageKey(key))
				if err != nil {
					return nil, err
				}
				if rec.LeaseUntil.After(latest) {
					latest = rec.LeaseUntil
				}
			}
		}
	})
	if !errors.Is(err, idem.ErrLeaseExpired) {
		t.Fatalf("the work ended with %v, want ErrLeaseExpired at the deadline", err)
	}
	if over := time.Since(deadline); over > 200*time.Millisecond {
		t.Fatalf("the work was told %v after the deadline", over)
	}
	if latest.IsZero() || latest.After(deadline.Add(5*time.Millisecond)) {
		t.Fatalf("the claim's lease reached %v, %v past the deadline", latest, latest.Sub(deadline))
	}
	if res.Disposition != idem.Hold {
		t.Fatalf("disposition %v, want the claim held until its lease ends", res.Disposition)
	}
	for time.Now().Before(deadline.Add(10 * time.Millisecond)) {
		time.Sleep(5 * time.Millisecond) // the deadline is a wall-clock time: wait for it
	}
	next, err := g.Run(context.Background(), key, nil, func(context.Context, uint64) ([]byte, error) { return []byte("done"), nil })
	if err != nil || next.Outcome != store.TakenOver {
		t.Fatalf("after the deadline: %v %v, want the key taken over", next.Outcome, err)
	}
}

// TestLeaseDeadlinePassedClaimsNothing: with no time left before the
// LeaseDeadline, Run claims nothing and runs nothing.
func TestLeaseDeadlinePassedClaimsNothing(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	key := idem.Key{Scope: "lambda", ID: "MSG-2"}
	ran := false
	_, err := g.Run(context.Background(), key, &idem.RunOptions{LeaseDeadline: time.Now().Add(-time.Second)}, func(context.Context, uint64) ([]byte, error) {
		ran = true
		return nil, nil
	})
	if !errors.Is(err, idem.ErrLeaseExpired) || ran {
		t.Fatalf("err %v, ran %v; want ErrLeaseExpired and no run", err, ran)
	}
	if _, err := s.Get(context.Background(), g.StorageKey(key)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the store holds a record: %v", err)
	}
}
