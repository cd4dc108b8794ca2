package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/storetest"
)

func TestSweeper(t *testing.T) {
	clock := storetest.NewManualClock(time.Now())
	s := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	defer s.Close()
	ctx := context.Background()
	for i := range 25 {
		k := idem.Key{ID: string(rune('a' + i))}.Storage(false)
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, k, a.Fence, nil, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	live := idem.Key{ID: "live"}.Storage(false)
	if _, err := s.Acquire(ctx, store.AcquireRequest{Key: live, Lease: time.Minute, Retention: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(5 * time.Millisecond)
	passes := make(chan int, 10)
	sw, err := idem.NewSweeper(idem.SweeperConfig{Store: s, Interval: 10 * time.Millisecond, Batch: 10,
		OnPass: func(n int, err error) {
			if err != nil {
				t.Error(err)
			}
			passes <- n
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sw.Start(ctx); err == nil {
		t.Fatal("second Start accepted")
	}
	if n := <-passes; n != 25 {
		t.Fatalf("first pass deleted %d, want 25", n)
	}
	if err := sw.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 1 {
		t.Fatalf("%d records left, want the live lease only", s.Len())
	}
}
