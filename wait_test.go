package idem_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
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
	if res, err := g.Run(ctx, key, nil, work); err != nil || res.Outcome != store.InProgress {
		t.Fatalf("without the option: %v %v", res.Outcome, err)
	}
	start := time.Now()
	if res, err := g.Run(ctx, key, &idem.RunOptions{WaitInProgress: 30 * time.Millisecond}, work); err != nil || res.Outcome != store.InProgress {
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
			if err == nil && res.Outcome == store.Replayed && string(res.Value) == "captured" {
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

// countingStore counts the calls its store gets.
type countingStore struct {
	store.Store
	acquires, gets atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	c.acquires.Add(1)
	return c.Store.Acquire(ctx, req)
}

func (c *countingStore) Get(ctx context.Context, key string) (store.Record, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, key)
}

// TestWaitersShareOnePoll: 50 duplicates wait for a key another process
// holds; they ask the store through one poll, not 50 (each claims once
// more when the key settles); those whose client left (WaitContext ended)
// stop waiting at once and ask nothing more; a key settled in this process
// wakes its waiters without a poll. Past MaxWaitersPerKey a duplicate is
// InProgress at once.
func TestWaitersShareOnePoll(t *testing.T) {
	mem := memstore.New(memstore.Config{})
	defer mem.Close()
	s := &countingStore{Store: mem}
	g, err := idem.NewGuard(idem.Config{Store: s, MaxWaitersPerKey: 40})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := idem.Key{Scope: "payments", ID: "PAY-2"}
	// Another process holds the key.
	acq, err := mem.Acquire(ctx, store.AcquireRequest{Key: g.StorageKey(key), Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var replayed, inProgress, left atomic.Int32
	clientLeft, leave := context.WithCancel(ctx)
	for i := range 50 {
		wctx := ctx
		if i%5 == 0 {
			wctx = clientLeft // ten of them: their clients leave
		}
		wg.Go(func() {
			res, err := g.Run(ctx, key, &idem.RunOptions{WaitInProgress: time.Minute, WaitContext: wctx}, func(context.Context, uint64) ([]byte, error) {
				t.Error("a duplicate ran the work")
				return nil, nil
			})
			switch {
			case err != nil:
				t.Error(err)
			case res.Outcome == store.Replayed:
				replayed.Add(1)
			case wctx == clientLeft && res.Outcome == store.InProgress:
				left.Add(1)
			case res.Outcome == store.InProgress:
				inProgress.Add(1)
			}
		})
	}
	// The 10 past the cap of 40 answer InProgress at once; the others wait.
	for inProgress.Load()+left.Load() < 10 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(time.Second) // the waiters wait a second (each used to claim every 5-200 ms: ~10 claims each)
	leave()
	for left.Load() < 10 { // every one whose client left, capped or waiting
		time.Sleep(time.Millisecond)
	}
	if err := mem.Complete(ctx, g.StorageKey(key), acq.Fence, []byte("done"), time.Hour); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// Each of the 50 claimed once, each of the 40 waiting once more on
	// joining and once when woken; the shared poll read the key a few
	// times a second.
	acquires, gets := s.acquires.Load(), s.gets.Load()
	t.Logf("50 duplicates, 40 waiting over a second: %d claims and %d reads in all; %d replayed, %d past the cap, %d whose clients left",
		acquires, gets, replayed.Load(), inProgress.Load(), left.Load())
	if acquires > 150 || gets > 40 {
		t.Errorf("%d claims and %d reads for 50 duplicates: the waiters do not share one poll", acquires, gets)
	}
	if replayed.Load()+inProgress.Load() != 40 || left.Load() != 10 {
		t.Errorf("%d replayed, %d left, %d in progress", replayed.Load(), left.Load(), inProgress.Load())
	}
}
