package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/storetest"
)

const goldenCompact = "Hx7HSuvJh2Lxx775NEpvog"

func newGuard(t *testing.T, cfg idem.Config) (*idem.Guard, *memstore.Store) {
	t.Helper()
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	cfg.Store = s
	g, err := idem.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g, s
}

var key = idem.Key{Scope: "test", ID: "k1"}

func TestNewGuardValidates(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	tests := []struct {
		name string
		cfg  idem.Config
		want string
	}{
		{"no store", idem.Config{}, "Config.Store"},
		{"negative lease", idem.Config{Store: s, Lease: -time.Second}, "Config.Lease"},
		{"huge retention", idem.Config{Store: s, Retention: 1000 * 24 * time.Hour}, "Config.Retention"},
		{"negative attempts", idem.Config{Store: s, MaxAttempts: -1}, "Config.MaxAttempts"},
		{"heartbeat too slow", idem.Config{Store: s, Lease: time.Second, HeartbeatInterval: 2 * time.Second}, "Config.HeartbeatInterval"},
		{"negative cache", idem.Config{Store: s, CacheSize: -1}, "Config.CacheSize"},
	}
	for _, tt := range tests {
		_, err := idem.NewGuard(tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to name %s", tt.name, err, tt.want)
		}
	}
}

func TestPolicyPerOutcome(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name      string
		err       error
		wantState store.State
		rerun     bool // the next delivery runs the work again
	}{
		{"success completes", nil, store.StateCompleted, false},
		{"permanent failure is stored", idem.Permanent(errors.New("card declined")), store.StateFailed, false},
		{"transient failure releases", errors.New("connection reset"), store.StateReleased, true},
		{"ambiguous failure holds", idem.Ambiguous(errors.New("timeout after send")), store.StateInFlight, false},
		{"deadline exceeded holds", context.DeadlineExceeded, store.StateInFlight, false},
		{"caller cancelled mid-work holds", context.Canceled, store.StateInFlight, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, s := newGuard(t, idem.Config{})
			res, err := g.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
				return []byte("v"), tt.err
			})
			if !errors.Is(err, tt.err) {
				t.Fatalf("Run error = %v, want the work's %v", err, tt.err)
			}
			rec, gerr := s.Get(ctx, g.StorageKey(key))
			if gerr != nil || rec.State != tt.wantState {
				t.Fatalf("record %+v, %v; want state %v", rec, gerr, tt.wantState)
			}
			ran := false
			res, err = g.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
				ran = true
				return nil, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if ran != tt.rerun {
				t.Fatalf("second delivery ran=%v (outcome %v), want %v", ran, res.Outcome, tt.rerun)
			}
		})
	}
}

func TestDoTyped(t *testing.T) {
	g, _ := newGuard(t, idem.Config{})
	ctx := context.Background()
	type booking struct{ ID string }
	runs := 0
	book := func(ctx context.Context) (booking, error) {
		runs++
		if f, ok := idem.FenceFrom(ctx); !ok || f == 0 {
			t.Errorf("no fence in the work's context")
		}
		return booking{ID: "B-1"}, nil
	}
	for range 3 {
		b, err := idem.Do(ctx, g, key, book)
		if err != nil || b.ID != "B-1" {
			t.Fatalf("Do = %+v, %v", b, err)
		}
	}
	if runs != 1 {
		t.Fatalf("ran %d times", runs)
	}
	// A definite failure is replayed as an error.
	k2 := idem.Key{Scope: "test", ID: "declined"}
	_, err := idem.Do(ctx, g, k2, func(ctx context.Context) (int, error) { return 0, idem.Permanent(errors.New("card declined")) })
	if err == nil || err.Error() != "card declined" {
		t.Fatalf("first run error %v", err)
	}
	_, err = idem.Do(ctx, g, k2, func(ctx context.Context) (int, error) { t.Fatal("ran again"); return 0, nil })
	var rf *idem.ReplayedFailure
	if !errors.As(err, &rf) || rf.Message != "card declined" {
		t.Fatalf("replayed failure: %v", err)
	}
	// Mismatch.
	_, err = idem.DoWith(ctx, g, key, &idem.RunOptions{Fingerprint: "other"}, book)
	if !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	// Bad key: a clear error, nothing runs.
	_, err = idem.Do(ctx, g, idem.Key{}, book)
	if !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
}

func TestInProgressAndPoison(t *testing.T) {
	g, _ := newGuard(t, idem.Config{MaxAttempts: 2})
	ctx := context.Background()
	release := make(chan struct{})
	started := make(chan struct{})
	go func() {
		_, _ = idem.Do(ctx, g, key, func(ctx context.Context) (int, error) {
			close(started)
			<-release
			return 0, errors.New("transient")
		})
	}()
	<-started
	if _, err := idem.Do(ctx, g, key, func(ctx context.Context) (int, error) { return 1, nil }); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("duplicate while in flight: %v", err)
	}
	close(release)
	// Wait for the release, then fail transiently once more: 2 attempts.
	for {
		_, err := idem.Do(ctx, g, key, func(ctx context.Context) (int, error) { return 0, errors.New("transient") })
		if errors.Is(err, idem.ErrInProgress) {
			time.Sleep(time.Millisecond)
			continue
		}
		break
	}
	_, err := idem.Do(ctx, g, key, func(ctx context.Context) (int, error) { t.Fatal("ran a poisoned key"); return 0, nil })
	if !errors.Is(err, idem.ErrPoisoned) {
		t.Fatalf("third attempt: %v, want ErrPoisoned", err)
	}
}

// TestHeartbeatKeepsLease: while the work runs past three leases, the
// Guard's heartbeats keep its claim, and a duplicate is told InProgress.
// The store's clock is a ManualClock moved a half lease at a time, each
// step waiting for a heartbeat (real ticks) that extends the lease from
// the new time: a machine too loaded to beat on time slows the test down,
// it does not fail it.
func TestHeartbeatKeepsLease(t *testing.T) {
	clock := storetest.NewManualClock(time.Now())
	s := memstore.New(memstore.Config{Clock: clock})
	t.Cleanup(func() { s.Close() })
	const lease = 600 * time.Millisecond
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: lease, HeartbeatInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = g.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
		for range 6 { // three leases
			clock.Advance(lease / 2)
			moved := clock.Now()
			testenv.Eventually(t, 10*time.Second, "a heartbeat after the clock moved", func() error {
				rec, err := s.Get(ctx, g.StorageKey(key))
				if err == nil && rec.LeaseUntil.Before(moved.Add(lease)) {
					err = fmt.Errorf("lease until %v, the clock at %v", rec.LeaseUntil, moved)
				}
				return err
			})
		}
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: g.StorageKey(key), Lease: time.Second, Retention: time.Hour})
		if err != nil || a.Outcome != store.InProgress {
			t.Errorf("while heartbeating, a duplicate got %v, %v", a.Outcome, err)
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLostLeaseCancelsWork(t *testing.T) {
	g, s := newGuard(t, idem.Config{Lease: 100 * time.Millisecond, HeartbeatInterval: 30 * time.Millisecond})
	ctx := context.Background()
	_, err := g.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
		// Someone deletes the record (an operator's idem keys rm): the
		// next heartbeat finds the fence stale and cancels this work.
		if err := s.Delete(ctx, g.StorageKey(key)); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			if !errors.Is(context.Cause(ctx), store.ErrStaleFence) {
				t.Errorf("cause = %v", context.Cause(ctx))
			}
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
			t.Error("work not cancelled after losing its lease")
			return nil, nil
		}
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("Run: %v, want the work's cancellation and why", err)
	}
}

func TestPanicHolds(t *testing.T) {
	g, s := newGuard(t, idem.Config{})
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("panic swallowed")
			}
		}()
		_, _ = g.Run(context.Background(), key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
			panic("boom")
		})
	}()
	rec, err := s.Get(context.Background(), g.StorageKey(key))
	if err != nil || rec.State != store.StateInFlight {
		t.Fatalf("after a panic: %+v, %v (want held in flight)", rec, err)
	}
}

// failingStore refuses every call, as an unreachable server does.
type failingStore struct{ store.Store }

func (failingStore) Acquire(context.Context, store.AcquireRequest) (store.Acquisition, error) {
	return store.Acquisition{}, idem.ErrStoreUnavailable
}

func TestFailsClosed(t *testing.T) {
	g, err := idem.NewGuard(idem.Config{Store: failingStore{}})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = idem.Do(context.Background(), g, key, func(ctx context.Context) (int, error) { ran = true; return 1, nil })
	if ran || !errors.Is(err, idem.ErrStoreUnavailable) {
		t.Fatalf("ran=%v err=%v: the work must not run without a claim", ran, err)
	}
}

func TestCacheAndObserver(t *testing.T) {
	var mu sync.Mutex
	var events []idem.Event
	g, s := newGuard(t, idem.Config{CacheSize: 10, Observer: func(e idem.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}})
	ctx := context.Background()
	var runs atomic.Int32
	fp := &idem.RunOptions{Fingerprint: "a"}
	for range 3 {
		if _, err := g.Run(ctx, key, fp, func(ctx context.Context, fence uint64) ([]byte, error) {
			runs.Add(1)
			return []byte("v"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Delete from the store: the cache still replays (documented), but a
	// different fingerprint is still a mismatch.
	_ = s.Delete(ctx, g.StorageKey(key))
	res, err := g.Run(ctx, key, fp, nil)
	if err != nil || !res.Cached || res.Outcome != store.Replayed || string(res.Value) != "v" {
		t.Fatalf("cached replay: %+v, %v", res, err)
	}
	res, err = g.Run(ctx, key, &idem.RunOptions{Fingerprint: "b"}, nil)
	if err != nil || res.Outcome != store.Mismatch {
		t.Fatalf("cached mismatch: %+v, %v", res, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	var acquires, settles, cached int
	for _, e := range events {
		switch e.Phase {
		case "acquire":
			acquires++
			if e.Cached {
				cached++
			}
		case "settle":
			settles++
		}
	}
	if acquires != 5 || settles != 1 || cached != 4 {
		t.Fatalf("events: %d acquires (%d cached), %d settles; want 5 (4), 1", acquires, cached, settles)
	}
}

// TestCallerCancelKeepsLease: the caller gives up (its context is cancelled)
// while the work keeps running (it ignores ctx, or calls a payment API with
// context.WithoutCancel). The lease must be kept for as long as the work
// runs, or a duplicate takes over and the work runs twice at once.
func TestCallerCancelKeepsLease(t *testing.T) {
	clock := storetest.NewManualClock(time.Unix(1_800_000_000, 0))
	s := memstore.New(memstore.Config{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { s.Close() })
	beats := make(chan error, 1000)
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: time.Second, HeartbeatInterval: 5 * time.Millisecond,
		Observer: func(e idem.Event) {
			if e.Phase == "heartbeat" {
				beats <- e.Err
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := g.Run(ctx, key, nil, func(_ context.Context, fence uint64) ([]byte, error) {
			close(started)
			<-finish // ignores its context, like a call made WithoutCancel
			return []byte("paid"), nil
		})
		done <- err
	}()
	<-started
	cancel()
	// waitBeat waits for a heartbeat that the store accepted after now.
	waitBeat := func() {
		t.Helper()
		deadline := time.After(5 * time.Second)
		var last error
		for {
			select {
			case err := <-beats:
				if err == nil {
					return
				}
				last = err
			case <-deadline:
				t.Fatalf("no heartbeat succeeded after the caller cancelled (last: %v): the lease lapses while the work runs", last)
			}
		}
	}
	dup := store.AcquireRequest{Key: g.StorageKey(key), Lease: time.Second, Retention: time.Hour}
	for range 3 { // three leases long, past the first lease's end
		clock.Advance(800 * time.Millisecond)
		for len(beats) > 0 {
			<-beats
		}
		waitBeat()
		if a, err := s.Acquire(context.Background(), dup); err != nil || a.Outcome != store.InProgress {
			t.Fatalf("while the work still runs, a duplicate got %v, %v", a.Outcome, err)
		}
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if a, err := s.Acquire(context.Background(), dup); err != nil || a.Outcome != store.Replayed || string(a.Record.Result) != "paid" {
		t.Fatalf("after the work finished: %v %q %v", a.Outcome, a.Record.Result, err)
	}
}

// TestWithDispositionOverridesClassify: a disposition the work decided
// applies whatever the Guard's policy says.
func TestWithDispositionOverridesClassify(t *testing.T) {
	ctx := context.Background()
	g, s := newGuard(t, idem.Config{Classify: func(error) idem.Disposition { return idem.Release }})
	for _, c := range []struct {
		id   string
		d    idem.Disposition
		want store.State
	}{
		{"complete", idem.Complete, store.StateCompleted},
		{"fail", idem.Fail, store.StateFailed},
		{"hold", idem.Hold, store.StateInFlight},
		{"release", idem.Release, store.StateReleased},
	} {
		k := idem.Key{Scope: "test", ID: c.id}
		cause := errors.New("decided by the work")
		res, err := g.Run(ctx, k, nil, func(context.Context, uint64) ([]byte, error) {
			return []byte("v"), idem.WithDisposition(c.d, cause)
		})
		if !errors.Is(err, cause) || res.Disposition != c.d {
			t.Fatalf("%s: disposition %v, err %v", c.id, res.Disposition, err)
		}
		if rec, err := s.Get(ctx, g.StorageKey(k)); err != nil || rec.State != c.want {
			t.Fatalf("%s: record %+v (%v), want %v", c.id, rec, err, c.want)
		}
	}
}

// flakyBeats fails the heartbeats while mode is beatsFail and holds them
// until their context ends while it is beatsHang, as a store out of reach
// does; every other call goes to the store.
type flakyBeats struct {
	store.Store
	mode *atomic.Int32
}

const (
	beatsPass = iota
	beatsFail
	beatsHang
)

func (s flakyBeats) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	switch s.mode.Load() {
	case beatsFail:
		return fmt.Errorf("%w: cut off", idem.ErrStoreUnavailable)
	case beatsHang:
		<-ctx.Done()
		return fmt.Errorf("%w: %w", idem.ErrStoreUnavailable, ctx.Err())
	}
	return s.Store.Heartbeat(ctx, key, fence, lease)
}

// TestLeaseWatchFollowsTheHeartbeats: heartbeats that fail for a while, less
// than a lease, do not stop the work — the next one that reaches the store
// extends the lease, and the work runs on past the end of the lease it
// started with; heartbeats that hang from then on (a stalled store: the
// Guard is stuck in one until its timeout) cancel the work with cause
// ErrLeaseExpired before the lease of the last heartbeat that reached the
// store ends. (The cancellation ahead of a real takeover is
// storetest.LeaseRunsOutInAnOutage, on each networked store.) The test
// waits on the Guard's heartbeat events.
func TestLeaseWatchFollowsTheHeartbeats(t *testing.T) {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	var mode atomic.Int32
	beats := make(chan error, 1000)
	var lastOK atomic.Int64 // when the last heartbeat that reached the store ended, in ns since started
	started := time.Now()
	const lease = time.Second
	g, err := idem.NewGuard(idem.Config{Store: flakyBeats{s, &mode}, Lease: lease, HeartbeatInterval: lease / 8,
		Observer: func(e idem.Event) {
			if e.Phase == "heartbeat" {
				if e.Err == nil {
					lastOK.Store(int64(time.Since(started)))
				}
				beats <- e.Err
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	next := func() error {
		select {
		case err := <-beats:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("no heartbeat in 10 s")
			return nil
		}
	}
	_, err = g.Run(context.Background(), key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
		mode.Store(beatsFail)
		for failed := 0; failed < 3; { // three intervals of eight: less than a lease
			if next() != nil {
				failed++
			}
		}
		mode.Store(beatsPass)
		for time.Since(started) < 2*lease {
			if next(); ctx.Err() != nil {
				t.Fatalf("cancelled after heartbeats failed for less than a lease: %v", context.Cause(ctx))
			}
		}
		mode.Store(beatsHang)
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the work ran on 10 s after its heartbeats stopped reaching the store")
		}
		if took := time.Since(started) - time.Duration(lastOK.Load()); took >= lease {
			t.Errorf("cancelled %v after the last heartbeat that reached the store: its lease had ended", took)
		}
		if cause := context.Cause(ctx); !errors.Is(cause, idem.ErrLeaseExpired) {
			t.Fatalf("cancelled with cause %v, want ErrLeaseExpired", cause)
		}
		return nil, ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, idem.ErrLeaseExpired) {
		t.Fatalf("Run: %v, want the work's cancellation and why", err)
	}
}

// slowAcquire answers acquisitions only after delay, as a stalled store
// does.
type slowAcquire struct {
	store.Store
	delay time.Duration
}

func (s slowAcquire) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	time.Sleep(s.delay) // the stall itself: a time, not an event
	return s.Store.Acquire(ctx, req)
}

// TestWorkNotRunWhenTheAcquisitionUsedTheLease: an acquisition whose
// answer came after the lease would have ended (by the Guard's count, from
// when it was sent) does not run the work: another owner may hold the key
// by then, and work that does its effect before it looks at its context
// would run beside it (the brokers' fault campaign over PostgreSQL: an
// acquisition's answer held in a stall for longer than the lease, the work
// started 260 ms after the taker's). Run fails as when nothing could be
// claimed, with ErrLeaseExpired; once the lease ended, the key is taken
// over and run.
func TestWorkNotRunWhenTheAcquisitionUsedTheLease(t *testing.T) {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	const lease = 200 * time.Millisecond
	g, err := idem.NewGuard(idem.Config{Store: slowAcquire{s, lease}, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	res, err := g.Run(context.Background(), key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
		t.Errorf("the work ran (its context's cause %v) though its lease was over when the acquisition answered", context.Cause(ctx))
		return nil, ctx.Err()
	})
	if !errors.Is(err, idem.ErrLeaseExpired) || res.Outcome.Owns() {
		t.Fatalf("Run: %v, %v; want ErrLeaseExpired and no claim", res.Outcome, err)
	}
	fast, err := idem.NewGuard(idem.Config{Store: s, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err = fast.Run(context.Background(), key, nil, func(context.Context, uint64) ([]byte, error) { return []byte("ran"), nil })
		if err != nil || res.Outcome != store.InProgress || time.Now().After(deadline) {
			break
		}
		time.Sleep(lease / 10) // the lease of the claim not run ends on the store's clock
	}
	if err != nil || res.Outcome != store.TakenOver || string(res.Value) != "ran" {
		t.Fatalf("after the lease: %v, %q, %v; want the key taken over and run", res.Outcome, res.Value, err)
	}
}

// lostSettleAnswer applies the first Complete and loses its answer, as a
// connection that broke after the store applied the statement does.
type lostSettleAnswer struct {
	store.Store
	lost atomic.Bool
}

func (s *lostSettleAnswer) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	err := s.Store.Complete(ctx, key, fence, result, retention)
	if err == nil && s.lost.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: the connection broke before the answer", idem.ErrStoreUnavailable)
	}
	return err
}

// TestSettleWhoseAnswerWasLost: a completion whose answer was lost is tried
// again; the store then finds the fence stale (the record is completed
// already), and the Guard asks whether the completion under its fence is
// what stands — it is, so the run succeeded.
func TestSettleWhoseAnswerWasLost(t *testing.T) {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	g, err := idem.NewGuard(idem.Config{Store: &lostSettleAnswer{Store: s}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v, err := idem.Do(ctx, g, key, func(ctx context.Context) (string, error) { return "done", nil })
	if err != nil || v != "done" {
		t.Fatalf("Do: %q, %v; want done", v, err)
	}
	rec, err := s.Get(ctx, g.StorageKey(key))
	if err != nil || rec.State != store.StateCompleted {
		t.Fatalf("the record: %+v, %v; want completed", rec, err)
	}
}

// TestLeaseWatchWithoutHeartbeats: with heartbeats disabled the lease is the
// one the acquisition took, and work still running at its end could be
// taken over by another process and run twice at once. The Guard cancels
// the work's context with cause ErrLeaseExpired before the store's lease
// ends — made when the work first asks for its context's Done or Err (work
// that never looks cannot be stopped, and needs no timer) — and so from the
// start when the acquisition used the lease up.
func TestLeaseWatchWithoutHeartbeats(t *testing.T) {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	const lease = 300 * time.Millisecond
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: lease, HeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Run("Done", func(t *testing.T) {
		k := idem.Key{Scope: "test", ID: "no-heartbeats-done"}
		var cancelled, deadline time.Time
		_, err := g.Run(ctx, k, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
			var ok bool
			if deadline, ok = ctx.Deadline(); !ok {
				return nil, errors.New("the work's context has no deadline, though its lease ends")
			}
			select {
			case <-ctx.Done():
				cancelled = time.Now()
			case <-time.After(20 * lease):
				return nil, errors.New("the work outlived its lease by 19 leases, uncancelled")
			}
			if cause := context.Cause(ctx); !errors.Is(cause, idem.ErrLeaseExpired) {
				return nil, fmt.Errorf("cancelled with cause %v, want ErrLeaseExpired", cause)
			}
			return nil, ctx.Err()
		})
		if !errors.Is(err, idem.ErrLeaseExpired) {
			t.Fatalf("Run: %v, want the work's cancellation for ErrLeaseExpired", err)
		}
		rec, gerr := s.Get(ctx, k.Storage(false))
		if gerr != nil {
			t.Fatal(gerr)
		}
		if !cancelled.Before(rec.LeaseUntil) {
			t.Fatalf("the work was cancelled at %v, not before the store's lease ended (%v)", cancelled, rec.LeaseUntil)
		}
		if !deadline.Before(rec.LeaseUntil) || cancelled.Before(deadline) {
			t.Fatalf("the context's deadline %v: want the lease's end by the Guard's count (cancelled at %v, the store's lease ends %v)",
				deadline, cancelled, rec.LeaseUntil)
		}
	})
	t.Run("Err", func(t *testing.T) {
		k := idem.Key{Scope: "test", ID: "no-heartbeats-err"}
		deadline := time.Now().Add(20 * lease)
		_, err := g.Run(ctx, k, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
			for ctx.Err() == nil { // a work that polls its context between steps
				if time.Now().After(deadline) {
					return nil, errors.New("the work outlived its lease by 19 leases, uncancelled")
				}
				time.Sleep(time.Millisecond) // one step of the work
			}
			return nil, ctx.Err()
		})
		if !errors.Is(err, idem.ErrLeaseExpired) {
			t.Fatalf("Run: %v, want the work's cancellation for ErrLeaseExpired", err)
		}
	})
	t.Run("SlowAcquisition", func(t *testing.T) {
		g, err := idem.NewGuard(idem.Config{Store: slowAcquire{s, lease}, Lease: lease, HeartbeatInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = g.Run(ctx, idem.Key{Scope: "test", ID: "no-heartbeats-slow"}, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
			return nil, ctx.Err()
		})
		if !errors.Is(err, idem.ErrLeaseExpired) {
			t.Fatalf("Run: %v, want the work started cancelled for ErrLeaseExpired", err)
		}
	})
}

// unreachableUntil refuses Complete and Heartbeat as an unreachable server
// does until open is closed.
type unreachableUntil struct {
	store.Store
	open chan struct{}
}

func (s *unreachableUntil) reachable() bool {
	select {
	case <-s.open:
		return true
	default:
		return false
	}
}

func (s *unreachableUntil) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	if !s.reachable() {
		return fmt.Errorf("%w: connection refused", idem.ErrStoreUnavailable)
	}
	return s.Store.Complete(ctx, key, fence, result, retention)
}

func (s *unreachableUntil) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	if !s.reachable() {
		return fmt.Errorf("%w: connection refused", idem.ErrStoreUnavailable)
	}
	return s.Store.Heartbeat(ctx, key, fence, lease)
}

// TestSettleTriesUntilTheLeaseEnds: a completion that cannot reach the store
// is tried again until the lease ends — its last try at the end, not a
// backoff pause before it. Lease 1 s, heartbeats every 333 ms, so the
// Guard's lease ends 900 ms after the work (its margin is 100 ms); the store
// is back 820 ms after the work ended. The doubling pauses bring tries at
// about 0, 10, 30, 70, 150, 310 and 630 ms, and the next pause (333 ms)
// would end past the lease: the fault campaign saw a Guard give up a settle
// this way with a second of its lease left, in short outages (PostgreSQL
// Guard campaign, seed 2875479024331763359). Now that pause is cut to end
// at the lease's end, where the try lands.
func TestSettleTriesUntilTheLeaseEnds(t *testing.T) {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	st := &unreachableUntil{Store: s, open: make(chan struct{})}
	g, err := idem.NewGuard(idem.Config{Store: st, Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v, err := idem.Do(ctx, g, key, func(ctx context.Context) (string, error) {
		time.AfterFunc(820*time.Millisecond, func() { close(st.open) })
		return "done", nil
	})
	if err != nil || v != "done" {
		t.Fatalf("Do: %q, %v; want done, settled once the store was back within the lease", v, err)
	}
	rec, err := s.Get(ctx, g.StorageKey(key))
	if err != nil || rec.State != store.StateCompleted {
		t.Fatalf("the record: %+v, %v; want completed", rec, err)
	}
}

// TestStoreClockStepsForward: the store's clock steps forward past the
// lease while the work runs (an NTP step on the store's server). The key can
// then be taken over at once — the Guard's own watch runs on the process's
// monotonic clock and has not run out — so two works run at the same time;
// what holds is the fence: the first owner's next heartbeat is refused and
// its work's context ends with ErrStaleFence, its result is not stored, and
// the key replays the taker's. (README, "The store's clock".)
func TestStoreClockStepsForward(t *testing.T) {
	clock := storetest.NewManualClock(time.Now())
	s := memstore.New(memstore.Config{Clock: clock})
	t.Cleanup(func() { s.Close() })
	const lease = 10 * time.Second
	cfg := idem.Config{Store: s, Lease: lease, HeartbeatInterval: time.Second}
	first, err := idem.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	taker, err := idem.NewGuard(cfg) // another process's Guard
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	running, taken := make(chan struct{}), make(chan struct{})
	firstRun := make(chan error, 1)
	go func() {
		_, err := first.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
			close(running)
			<-taken
			<-ctx.Done() // told at its next heartbeat
			return []byte("first"), nil
		})
		firstRun <- err
	}()
	<-running
	clock.Advance(lease + time.Second) // before the first heartbeat, a second away
	res, err := taker.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
		close(taken)
		return []byte("taker"), nil
	})
	if err != nil || res.Outcome != store.TakenOver {
		t.Fatalf("after the step: %v %v, want the key taken over", res.Outcome, err)
	}
	if err := <-firstRun; !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("the first owner's Run: %v, want ErrStaleFence", err)
	}
	rec, err := s.Get(ctx, first.StorageKey(key))
	if err != nil || rec.State != store.StateCompleted || string(rec.Result) != "taker" {
		t.Fatalf("the record: %+v %v, want the taker's result", rec, err)
	}
}
