package idem_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/memstore"
)

// TestDuplicatesWait: with RunOptions.WaitInProgress, 50 concurrent
// duplicates of a key in progress wait for it: one execution, 49 replays of
// its result, and none waits past the bound; without the option, a
// duplicate is InProgress at once; past the bound, InProgress.
func TestDuplicatesWait(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, err := idem.NewGuard(idem.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := idem.Key{Scope: "payments", ID: "PAY-1"}
	const bound = 5 * time.Second
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	work := func(context.Context, uint64) ([]byte, error) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
		return []byte("captured"), nil
	}
	go func() {
		if _, err := g.Run(ctx, key, nil, work); err != nil {
			t.Error(err)
		}
	}()
	<-started
	if res, err := g.Run(ctx, key, nil, work); err != nil || res.Outcome != idem.InProgress {
		t.Fatalf("without the option: %v %v", res.Outcome, err)
	}
	start := time.Now()
	if res, err := g.Run(ctx, key, &idem.RunOptions{WaitInProgress: 30 * time.Millisecond}, work); err != nil || res.Outcome != idem.InProgress {
		t.Fatalf("past a short bound: %v %v", res.Outcome, err)
	} else if waited := time.Since(start); waited < 30*time.Millisecond || waited > bound {
		t.Fatalf("waited %v for a bound of 30ms", waited)
	}
	var wg sync.WaitGroup
	var replays atomic.Int32
	var longest atomic.Int64
	for range 49 {
		wg.Go(func() {
			start := time.Now()
			res, err := g.Run(ctx, key, &idem.RunOptions{WaitInProgress: bound}, work)
			longest.Store(max(longest.Load(), int64(time.Since(start))))
			if err == nil && res.Outcome == idem.Replayed && string(res.Value) == "captured" {
				replays.Add(1)
			}
		})
	}
	close(release)
	wg.Wait()
	if runs.Load() != 1 || replays.Load() != 49 || time.Duration(longest.Load()) > bound {
		t.Fatalf("%d runs, %d replays, the longest wait %v", runs.Load(), replays.Load(), time.Duration(longest.Load()))
	}
}
