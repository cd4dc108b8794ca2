package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// Capabilities declare what a backend can do; the suite runs the cases that
// apply.
type Capabilities struct {
	// Persistent: records survive the process (used by MultiProcess users;
	// informative here).
	Persistent bool
	// ListsRecords: the store implements store.Lister.
	ListsRecords bool
	// SelfExpiring: the backend deletes expired records by itself (Redis
	// TTLs), so Sweep finds nothing to delete; the sweep case then checks
	// that expired records are gone and live leases kept.
	SelfExpiring bool
	// Archives: the store implements store.Archiver.
	Archives bool
	// Unclaims: the store implements store.Unclaimer.
	Unclaims bool
	// FencedDeletes: the store implements store.FencedDeleter.
	FencedDeletes bool
}

// NewStore returns a fresh, isolated store for one case and registers its
// cleanup on t.
type NewStore func(t testing.TB) store.Store

// Timing of the lease cases. Generous margins, because the suite runs under
// -race on a loaded two-core machine.
const (
	shortLease = 300 * time.Millisecond
	longLease  = time.Minute
	retention  = time.Hour
)

func req(key string) store.AcquireRequest {
	return store.AcquireRequest{Key: key, Fingerprint: "fp", Lease: longLease, Retention: retention}
}

// Run runs every conformance case as a subtest of t.
func Run(t *testing.T, caps Capabilities, newStore NewStore) {
	cases := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"AcquireAbsent", testAcquireAbsent},
		{"ConcurrentAcquireOneWins", testConcurrentAcquire},
		{"ConcurrentLifecyclesOverSharedKeys", testConcurrentLifecycles},
		{"InProgressWhileLeaseLives", testInProgress},
		{"TakeoverAfterLeaseExpiry", testTakeover},
		{"ConcurrentTakeoverOneWins", testConcurrentTakeover},
		{"StaleFenceRefused", testStaleFence},
		{"ReplayCompleted", testReplayCompleted},
		{"ReplayFailed", testReplayFailed},
		{"ReplayedBytesAreTheCallers", testReplayedBytesAreTheCallers},
		{"ReleaseThenReacquire", testRelease},
		{"FingerprintMismatch", testMismatch},
		{"HeartbeatExtendsLease", testHeartbeat},
		{"RetentionExpiryForgets", testRetention},
		{"SweepKeepsLiveLeases", func(t *testing.T, s store.Store) { testSweep(t, s, caps.SelfExpiring) }},
		{"PoisonAfterAttemptLimit", testPoison},
		{"BoundsRefused", testBounds},
		{"CancelledContextReturnsPromptly", testCancelled},
		{"GetAndDelete", testGetDelete},
		{"ScopesAreSeparate", testScopes},
		{"CompactKeys", testCompact},
		{"GuardRunsOnce", testGuardRunsOnce},
		{"GuardCacheAndCompactKeys", testGuardCacheCompact},
		{"FenceGrowsAcrossDelete", testFenceAcrossDelete},
		{"FenceGrowsAcrossSweep", testFenceAcrossSweep},
		{"FenceGrowsAcrossExpiry", testFenceAcrossExpiry},
		{"SettlePastRetentionRefused", testSettlePastRetention},
		{"PoisonKeepsRetention", testPoisonKeepsRetention},
		{"ReleaseKeepsRetention", testReleaseKeepsRetention},
		{"CountStates", testCountStates},
	}
	if caps.ListsRecords {
		cases = append(cases, struct {
			name string
			fn   func(t *testing.T, s store.Store)
		}{"List", testList})
	}
	if caps.Archives {
		cases = append(cases, struct {
			name string
			fn   func(t *testing.T, s store.Store)
		}{"Archive", testArchive})
	}
	if caps.Unclaims {
		cases = append(cases, struct {
			name string
			fn   func(t *testing.T, s store.Store)
		}{"UnclaimTakesBackTheAttempt", testUnclaim}, struct {
			name string
			fn   func(t *testing.T, s store.Store)
		}{"PoisonClaimEndsTheClaimPoisoned", testPoisonClaim})
	}
	if caps.FencedDeletes {
		cases = append(cases, struct {
			name string
			fn   func(t *testing.T, s store.Store)
		}{"DeleteUpToKeepsALaterGeneration", testDeleteUpTo})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, newStore(t))
		})
	}
}

func mustAcquire(t *testing.T, s store.Store, r store.AcquireRequest, want store.Outcome) store.Acquisition {
	t.Helper()
	a, err := s.Acquire(context.Background(), r)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", r.Key, err)
	}
	if a.Outcome != want {
		t.Fatalf("Acquire(%q) = %v, want %v (record %+v)", r.Key, a.Outcome, want, a.Record)
	}
	return a
}

func testAcquireAbsent(t *testing.T, s store.Store) {
	a := mustAcquire(t, s, req("k"), store.Acquired)
	if a.Fence == 0 {
		t.Fatal("fence is 0")
	}
	if a.Record.State != store.StateInFlight || a.Record.Attempts != 1 || a.Record.Fingerprint != "fp" {
		t.Fatalf("record after acquire = %+v", a.Record)
	}
	if !a.Record.LeaseUntil.After(now(s).Add(longLease / 2)) {
		t.Fatalf("lease until %v, want about now+%v", a.Record.LeaseUntil, longLease)
	}
}

func testConcurrentAcquire(t *testing.T, s store.Store) {
	const n = 64
	var owners, inProgress atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a, err := s.Acquire(context.Background(), req("hot"))
			if err != nil {
				errs <- err
				return
			}
			switch a.Outcome {
			case store.Acquired:
				owners.Add(1)
			case store.InProgress:
				inProgress.Add(1)
			default:
				errs <- fmt.Errorf("unexpected outcome %v", a.Outcome)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if owners.Load() != 1 || inProgress.Load() != n-1 {
		t.Fatalf("owners=%d in-progress=%d, want 1 and %d", owners.Load(), inProgress.Load(), n-1)
	}
}

// testConcurrentLifecycles: 48 goroutines run lifecycles over 40 shared
// keys at once, with two lease lengths, completing or failing what they
// own — the traffic a store that coalesces calls batches. Every key is
// settled by exactly one owner, and every other answer for it is that
// owner's (in progress before, a replay of its result after).
func testConcurrentLifecycles(t *testing.T, s store.Store) {
	const workers, keys, rounds = 48, 40, 12
	type settled struct {
		result []byte
		fence  uint64
	}
	var mu sync.Mutex
	won := map[string]settled{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx := context.Background()
			for r := range rounds {
				k := fmt.Sprintf("shared-%d", (w*7+r*13)%keys)
				rq := req(k)
				if w%2 == 1 {
					rq.Lease = 2 * longLease
				}
				a, err := s.Acquire(ctx, rq)
				if err != nil {
					t.Errorf("acquire %s: %v", k, err)
					return
				}
				switch a.Outcome {
				case store.Acquired:
					result := fmt.Appendf(nil, "by %d in round %d", w, r)
					settle := s.Complete
					if w%3 == 0 {
						settle = s.Fail
					}
					if err := settle(ctx, k, a.Fence, result, retention); err != nil {
						t.Errorf("settle %s with the fence just acquired: %v", k, err)
						return
					}
					mu.Lock()
					if prev, dup := won[k]; dup {
						t.Errorf("%s settled twice: %q (fence %d) and %q (fence %d)", k, prev.result, prev.fence, result, a.Fence)
					}
					won[k] = settled{result, a.Fence}
					mu.Unlock()
				case store.InProgress:
				case store.Replayed:
					mu.Lock()
					prev, ok := won[k]
					mu.Unlock()
					if ok && (!bytes.Equal(a.Record.Result, prev.result) || a.Record.Fence != prev.fence) {
						t.Errorf("%s replayed %q (fence %d), the owner settled %q (fence %d)", k, a.Record.Result, a.Record.Fence, prev.result, prev.fence)
					}
				default:
					t.Errorf("%s: outcome %v", k, a.Outcome)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	for k, w := range won {
		rec, err := s.Get(context.Background(), k)
		if err != nil || !bytes.Equal(rec.Result, w.result) || rec.Fence != w.fence {
			t.Errorf("%s: stored %q (fence %d), %v; the owner settled %q (fence %d)", k, rec.Result, rec.Fence, err, w.result, w.fence)
		}
	}
}

func testInProgress(t *testing.T, s store.Store) {
	a := mustAcquire(t, s, req("k"), store.Acquired)
	b := mustAcquire(t, s, req("k"), store.InProgress)
	if b.Record.Fence != a.Fence {
		t.Fatalf("in-progress record fence %d, want %d", b.Record.Fence, a.Fence)
	}
	if b.Record.Attempts != 1 {
		t.Fatalf("an in-progress answer counted an attempt: %d", b.Record.Attempts)
	}
}

func expireLease(t *testing.T, s store.Store) store.Acquisition {
	t.Helper()
	r := req("k")
	r.Lease = shortLease
	a := mustAcquire(t, s, r, store.Acquired)
	pass(s, shortLease+100*time.Millisecond)
	return a
}

func testTakeover(t *testing.T, s store.Store) {
	a := expireLease(t, s)
	b := mustAcquire(t, s, req("k"), store.TakenOver)
	if b.Fence <= a.Fence {
		t.Fatalf("takeover fence %d not larger than %d", b.Fence, a.Fence)
	}
	if b.Record.Attempts != 2 {
		t.Fatalf("attempts after takeover = %d, want 2", b.Record.Attempts)
	}
	mustAcquire(t, s, req("k"), store.InProgress)
}

func testConcurrentTakeover(t *testing.T, s store.Store) {
	expireLease(t, s)
	const n = 32
	var owners atomic.Int32
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := s.Acquire(context.Background(), req("k"))
			if err != nil {
				t.Error(err)
				return
			}
			if a.Outcome.Owns() {
				owners.Add(1)
			} else if a.Outcome != store.InProgress {
				t.Errorf("outcome %v", a.Outcome)
			}
		}()
	}
	wg.Wait()
	if owners.Load() != 1 {
		t.Fatalf("%d goroutines took over an expired lease, want 1", owners.Load())
	}
}

func testStaleFence(t *testing.T, s store.Store) {
	ctx := context.Background()
	old := expireLease(t, s)
	cur := mustAcquire(t, s, req("k"), store.TakenOver)
	checks := map[string]error{
		"Heartbeat": s.Heartbeat(ctx, "k", old.Fence, longLease),
		"Complete":  s.Complete(ctx, "k", old.Fence, []byte("zombie"), retention),
		"Fail":      s.Fail(ctx, "k", old.Fence, []byte("zombie"), retention),
		"Release":   s.Release(ctx, "k", old.Fence),
	}
	for op, err := range checks {
		if !errors.Is(err, store.ErrStaleFence) {
			t.Errorf("%s with stale fence: err = %v, want ErrStaleFence", op, err)
		}
	}
	rec, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.StateInFlight || rec.Fence != cur.Fence {
		t.Fatalf("stale calls changed the record: %+v", rec)
	}
	if err := s.Complete(ctx, "k", cur.Fence, []byte("winner"), retention); err != nil {
		t.Fatalf("current owner's Complete: %v", err)
	}
	// After settling, even the winner's fence is no longer in flight.
	if err := s.Complete(ctx, "k", cur.Fence, []byte("again"), retention); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("second Complete: err = %v, want ErrStaleFence", err)
	}
	if err := s.Heartbeat(ctx, "absent", 1, longLease); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("Heartbeat on absent key: err = %v, want ErrStaleFence", err)
	}
	rep := mustAcquire(t, s, req("k"), store.Replayed)
	if string(rep.Record.Result) != "winner" {
		t.Fatalf("replayed %q, want winner", rep.Record.Result)
	}
}

func testReplayCompleted(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := mustAcquire(t, s, req("k"), store.Acquired)
	result := []byte(`{"booking":"B-1"}` + "\x00\xff")
	if err := s.Complete(ctx, "k", a.Fence, result, retention); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r := mustAcquire(t, s, req("k"), store.Replayed)
		if !bytes.Equal(r.Record.Result, result) || r.Record.State != store.StateCompleted {
			t.Fatalf("replayed %+v", r.Record)
		}
		if r.Record.Attempts != 1 {
			t.Fatalf("replay counted an attempt: %d", r.Record.Attempts)
		}
	}
	// An empty result is stored and replayed as empty.
	b := mustAcquire(t, s, req("empty"), store.Acquired)
	if err := s.Complete(ctx, "empty", b.Fence, nil, retention); err != nil {
		t.Fatal(err)
	}
	if r := mustAcquire(t, s, req("empty"), store.Replayed); len(r.Record.Result) != 0 {
		t.Fatalf("empty result replayed as %q", r.Record.Result)
	}
}

// testReplayedBytesAreTheCallers: the bytes a store hands out are the
// caller's to modify, and so are the ones it was given: a caller that
// changes its result after Complete, or a replayed value after Acquire or
// Get, changes nothing the next duplicate receives — through the store and
// through a Guard with its cache.
func testReplayedBytesAreTheCallers(t *testing.T, s store.Store) {
	ctx := context.Background()
	want := []byte("booking B-1")
	a := mustAcquire(t, s, req("k"), store.Acquired)
	given := bytes.Clone(want)
	if err := s.Complete(ctx, "k", a.Fence, given, retention); err != nil {
		t.Fatal(err)
	}
	copy(given, "XXXXXXX")
	for range 2 {
		r := mustAcquire(t, s, req("k"), store.Replayed)
		if !bytes.Equal(r.Record.Result, want) {
			t.Fatalf("replayed %q, want %q", r.Record.Result, want)
		}
		copy(r.Record.Result, "XXXXXXX")
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || !bytes.Equal(rec.Result, want) {
		t.Fatalf("Get: %q (%v), want %q", rec.Result, err, want)
	}
	copy(rec.Result, "XXXXXXX")
	if r := mustAcquire(t, s, req("k"), store.Replayed); !bytes.Equal(r.Record.Result, want) {
		t.Fatalf("replayed %q after Get's bytes were changed, want %q", r.Record.Result, want)
	}
	g, err := idem.NewGuard(idem.Config{Store: s, CacheSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "s", ID: "cached"}
	work := func(context.Context, uint64) ([]byte, error) { return bytes.Clone(want), nil }
	for range 3 {
		res, err := g.Run(ctx, key, nil, work)
		if err != nil || !bytes.Equal(res.Value, want) {
			t.Fatalf("Guard: %q (%v), want %q", res.Value, err, want)
		}
		copy(res.Value, "XXXXXXX")
	}
}

func testReplayFailed(t *testing.T, s store.Store) {
	a := mustAcquire(t, s, req("k"), store.Acquired)
	if err := s.Fail(context.Background(), "k", a.Fence, []byte("card declined"), retention); err != nil {
		t.Fatal(err)
	}
	r := mustAcquire(t, s, req("k"), store.Replayed)
	if r.Record.State != store.StateFailed || string(r.Record.Result) != "card declined" {
		t.Fatalf("replayed %+v", r.Record)
	}
}

func testRelease(t *testing.T, s store.Store) {
	a := mustAcquire(t, s, req("k"), store.Acquired)
	if err := s.Release(context.Background(), "k", a.Fence); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(context.Background(), "k")
	if err != nil || rec.State != store.StateReleased {
		t.Fatalf("after release: %+v, %v", rec, err)
	}
	b := mustAcquire(t, s, req("k"), store.Acquired)
	if b.Fence <= a.Fence || b.Record.Attempts != 2 {
		t.Fatalf("re-acquire after release: fence %d (was %d), attempts %d", b.Fence, a.Fence, b.Record.Attempts)
	}
	if err := s.Release(context.Background(), "k", a.Fence); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("release with the old fence: %v", err)
	}
}

func testMismatch(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := mustAcquire(t, s, req("k"), store.Acquired)
	other := req("k")
	other.Fingerprint = "other"
	mustAcquire(t, s, other, store.Mismatch)
	if err := s.Complete(ctx, "k", a.Fence, []byte("ok"), retention); err != nil {
		t.Fatal(err)
	}
	m := mustAcquire(t, s, other, store.Mismatch)
	if m.Record.Fingerprint != "fp" {
		t.Fatalf("mismatch changed the stored fingerprint: %+v", m.Record)
	}
	if r := mustAcquire(t, s, req("k"), store.Replayed); string(r.Record.Result) != "ok" {
		t.Fatalf("replay after mismatch: %q", r.Record.Result)
	}
}

func testHeartbeat(t *testing.T, s store.Store) {
	ctx := context.Background()
	r := req("k")
	r.Lease = shortLease
	a := mustAcquire(t, s, r, store.Acquired)
	pass(s, shortLease/2)
	if err := s.Heartbeat(ctx, "k", a.Fence, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	pass(s, shortLease)
	// Past the original lease, before the extended one.
	mustAcquire(t, s, r, store.InProgress)
	rec, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.LeaseUntil.After(now(s).Add(time.Second)) {
		t.Fatalf("lease until %v, want about 3s after the heartbeat", rec.LeaseUntil)
	}
}

func testRetention(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := mustAcquire(t, s, req("k"), store.Acquired)
	if err := s.Complete(ctx, "k", a.Fence, []byte("r"), time.Second); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, req("k"), store.Replayed)
	pass(s, 1300*time.Millisecond)
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after retention: %v, want ErrNotFound", err)
	}
	b := mustAcquire(t, s, req("k"), store.Acquired)
	if b.Record.Attempts != 1 || len(b.Record.Result) != 0 {
		t.Fatalf("a key past retention is new again: %+v", b.Record)
	}
}

func testSweep(t *testing.T, s store.Store, selfExpiring bool) {
	ctx := context.Background()
	for i := range 5 {
		k := fmt.Sprintf("done-%d", i)
		a := mustAcquire(t, s, req(k), store.Acquired)
		if err := s.Complete(ctx, k, a.Fence, nil, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	// A live lease whose retention is shorter than its lease.
	live := req("live")
	live.Retention = 50 * time.Millisecond
	mustAcquire(t, s, live, store.Acquired)
	mustAcquire(t, s, req("kept"), store.Acquired)
	pass(s, 300*time.Millisecond)
	total := 0
	for {
		n, err := s.Sweep(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n > 2 {
			t.Fatalf("Sweep(limit 2) deleted %d", n)
		}
		if n == 0 {
			break
		}
		total += n
	}
	if total != 5 && !selfExpiring {
		t.Fatalf("swept %d records, want 5", total)
	}
	for i := range 5 {
		if _, err := s.Get(ctx, fmt.Sprintf("done-%d", i)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("expired record done-%d still there: %v", i, err)
		}
	}
	for _, k := range []string{"live", "kept"} {
		if _, err := s.Get(ctx, k); err != nil {
			t.Fatalf("Sweep deleted %s: %v", k, err)
		}
	}
	mustAcquire(t, s, live, store.InProgress)
}

func testPoison(t *testing.T, s store.Store) {
	ctx := context.Background()
	r := req("k")
	r.MaxAttempts = 3
	for i := 1; i <= 3; i++ {
		a := mustAcquire(t, s, r, store.Acquired)
		if a.Record.Attempts != i {
			t.Fatalf("attempt %d: record says %d", i, a.Record.Attempts)
		}
		if err := s.Release(ctx, "k", a.Fence); err != nil {
			t.Fatal(err)
		}
	}
	mustAcquire(t, s, r, store.Poisoned)
	mustAcquire(t, s, r, store.Poisoned)
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.State != store.StatePoisoned || rec.Attempts != 3 {
		t.Fatalf("poisoned record: %+v, %v", rec, err)
	}
	// A takeover counts as an attempt too.
	r2 := req("z")
	r2.MaxAttempts = 1
	r2.Lease = shortLease
	claim := mustAcquire(t, s, r2, store.Acquired)
	pass(s, shortLease+100*time.Millisecond)
	p := mustAcquire(t, s, r2, store.Poisoned)
	// Poisoning is a change another caller made after the claim: it takes
	// a fence of its own, so nothing fenced on the claim (a DeleteUpTo of
	// it, say) touches the poisoned record.
	if p.Record.Fence <= claim.Fence {
		t.Fatalf("the poisoned record's fence %d, the claim's %d: want a larger one", p.Record.Fence, claim.Fence)
	}
	if p.Fence != 0 {
		t.Fatalf("a Poisoned answer handed out fence %d", p.Fence)
	}
	// The same without a fingerprint: the smallest record a store keeps
	// (no fingerprint, no result, no settle), read back and decided on.
	r3 := r2
	r3.Key, r3.Fingerprint = "bare", ""
	mustAcquire(t, s, r3, store.Acquired)
	pass(s, shortLease+100*time.Millisecond)
	mustAcquire(t, s, r3, store.Poisoned)
	if rec, err := s.Get(ctx, "bare"); err != nil || rec.State != store.StatePoisoned || rec.Fingerprint != "" || rec.Attempts != 1 {
		t.Fatalf("a record poisoned by a takeover, without a fingerprint: %+v, %v", rec, err)
	}
	mustAcquire(t, s, r3, store.Poisoned)
}

func testBounds(t *testing.T, s store.Store) {
	ctx := context.Background()
	big := strings.Repeat("k", 10<<10)
	okReq := req("ok")
	a := mustAcquire(t, s, okReq, store.Acquired)
	huge := make([]byte, 100<<20)
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"empty key", first(s.Acquire(ctx, store.AcquireRequest{Key: "", Lease: time.Second, Retention: time.Hour})), store.ErrInvalidKey},
		{"10KB key", first(s.Acquire(ctx, store.AcquireRequest{Key: big, Lease: time.Second, Retention: time.Hour})), store.ErrInvalidKey},
		{"negative lease", first(s.Acquire(ctx, store.AcquireRequest{Key: "n", Lease: -time.Second, Retention: time.Hour})), store.ErrInvalidLease},
		{"zero lease", first(s.Acquire(ctx, store.AcquireRequest{Key: "n", Retention: time.Hour})), store.ErrInvalidLease},
		{"lease over the limit", first(s.Acquire(ctx, store.AcquireRequest{Key: "n", Lease: 1000 * time.Hour, Retention: time.Hour})), store.ErrInvalidLease},
		{"zero retention", first(s.Acquire(ctx, store.AcquireRequest{Key: "n", Lease: time.Second})), store.ErrInvalidRetention},
		{"long fingerprint", first(s.Acquire(ctx, store.AcquireRequest{Key: "n", Fingerprint: big, Lease: time.Second, Retention: time.Hour})), store.ErrInvalidFingerprint},
		{"100MB result", s.Complete(ctx, "ok", a.Fence, huge, retention), store.ErrResultTooLarge},
		{"100MB failure", s.Fail(ctx, "ok", a.Fence, huge, retention), store.ErrResultTooLarge},
		{"negative heartbeat", s.Heartbeat(ctx, "ok", a.Fence, -time.Second), store.ErrInvalidLease},
		{"negative retention", s.Complete(ctx, "ok", a.Fence, nil, -time.Second), store.ErrInvalidRetention},
		{"10KB key complete", s.Complete(ctx, big, 1, nil, retention), store.ErrInvalidKey},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, tt.err, tt.want)
		}
	}
	for _, k := range []string{"n", big[:store.MaxKeyBytes]} {
		if _, err := s.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("refused input stored something under %.10q: %v", k, err)
		}
	}
	rec, err := s.Get(ctx, "ok")
	if err != nil || rec.State != store.StateInFlight || len(rec.Result) != 0 {
		t.Fatalf("refused settle changed the record: %+v, %v", rec, err)
	}
	// The largest key is accepted.
	mustAcquire(t, s, req(big[:store.MaxKeyBytes]), store.Acquired)
}

func first[T any](_ T, err error) error { return err }

func testCancelled(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	_, err := s.Acquire(ctx, req("k"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context: %v, want context.Canceled", err)
	}
	if err := s.Complete(ctx, "k", 1, nil, retention); !errors.Is(err, context.Canceled) {
		t.Fatalf("Complete with a cancelled context: %v", err)
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a cancelled context: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancelled calls took %v", d)
	}
	if _, err := s.Get(context.Background(), "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a cancelled Acquire stored the key: %v", err)
	}
}

func testGetDelete(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get absent: %v", err)
	}
	a := mustAcquire(t, s, req("k"), store.Acquired)
	if err := s.Complete(ctx, "k", a.Fence, []byte("v"), retention); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Key != "k" || rec.State != store.StateCompleted || string(rec.Result) != "v" || rec.Fence != a.Fence ||
		rec.Fingerprint != "fp" || !rec.LeaseUntil.IsZero() || rec.ExpiresAt.Before(now(s).Add(retention/2)) {
		t.Fatalf("Get = %+v", rec)
	}
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatalf("Delete absent: %v", err)
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	mustAcquire(t, s, req("k"), store.Acquired)
}

func testScopes(t *testing.T, s store.Store) {
	ctx := context.Background()
	ka := idem.Key{Scope: "tenant-a", ID: "order-1"}.Storage(false)
	kb := idem.Key{Scope: "tenant-b", ID: "order-1"}.Storage(false)
	a := mustAcquire(t, s, req(ka), store.Acquired)
	if err := s.Complete(ctx, ka, a.Fence, []byte("a's secret"), retention); err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, s, req(kb), store.Acquired)
	if len(b.Record.Result) != 0 {
		t.Fatalf("tenant b sees %q", b.Record.Result)
	}
}

func testCompact(t *testing.T, s store.Store) {
	ctx := context.Background()
	k := idem.Key{Scope: "payments", ID: strings.Repeat("x", idem.MaxIDBytes)}
	ck := k.Storage(true)
	a := mustAcquire(t, s, req(ck), store.Acquired)
	if err := s.Complete(ctx, ck, a.Fence, []byte("v"), retention); err != nil {
		t.Fatal(err)
	}
	if r := mustAcquire(t, s, req(k.Storage(true)), store.Replayed); string(r.Record.Result) != "v" {
		t.Fatalf("compact replay %q", r.Record.Result)
	}
	mustAcquire(t, s, req(k.Storage(false)), store.Acquired)
}

func testGuardRunsOnce(t *testing.T, s store.Store) {
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				v, err := idem.Do(context.Background(), g, idem.Key{Scope: "s", ID: "once"}, func(ctx context.Context) (int, error) {
					runs.Add(1)
					time.Sleep(20 * time.Millisecond)
					return 42, nil
				})
				if errors.Is(err, idem.ErrInProgress) {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				if err != nil || v != 42 {
					t.Errorf("Do = %d, %v", v, err)
				}
				return
			}
		}()
	}
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("work ran %d times, want 1", runs.Load())
	}
}

func testList(t *testing.T, s store.Store) {
	l := s.(store.Lister)
	ctx := context.Background()
	for _, k := range []string{"c", "a", "b", "d"} {
		mustAcquire(t, s, req(k), store.Acquired)
	}
	recs, err := l.List(ctx, "a", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Key != "b" || recs[1].Key != "c" {
		t.Fatalf("List(after a, 2) = %+v", recs)
	}
}

// testCountStates: a store that counts by state (store.StateCounter)
// counts each live record once, in its state.
func testCountStates(t *testing.T, s store.Store) {
	c, ok := s.(store.StateCounter)
	if !ok {
		t.Skip("the store does not count by state")
	}
	ctx := context.Background()
	mustAcquire(t, s, req("flight"), store.Acquired)
	done := mustAcquire(t, s, req("done"), store.Acquired)
	if err := s.Complete(ctx, "done", done.Fence, []byte("ok"), retention); err != nil {
		t.Fatal(err)
	}
	failed := mustAcquire(t, s, req("failed"), store.Acquired)
	if err := s.Fail(ctx, "failed", failed.Fence, []byte("no"), retention); err != nil {
		t.Fatal(err)
	}
	rel := mustAcquire(t, s, req("released"), store.Acquired)
	if err := s.Release(ctx, "released", rel.Fence); err != nil {
		t.Fatal(err)
	}
	p := req("poisoned")
	p.MaxAttempts = 1
	pa := mustAcquire(t, s, p, store.Acquired)
	if err := s.Release(ctx, "poisoned", pa.Fence); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, p, store.Poisoned)
	got, err := c.CountStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[store.State]int64{store.StateInFlight: 1, store.StateCompleted: 1, store.StateFailed: 1, store.StateReleased: 1, store.StatePoisoned: 1}
	for st, n := range want {
		if got[st] != n {
			t.Fatalf("counts %v, want %v", got, want)
		}
	}
}

func testArchive(t *testing.T, s store.Store) {
	a := s.(store.Archiver)
	if sa, ok := s.(store.StoredArchiver); ok {
		a = storedChecker{t, sa}
	}
	ctx := context.Background()
	rec := store.Record{Key: "arch", State: store.StateCompleted, Fence: 7, Fingerprint: "fp", Attempts: 1, Result: []byte("first")}
	if err := a.Archive(ctx, rec, retention); err != nil {
		t.Fatal(err)
	}
	second := rec
	second.Result = []byte("second")
	if err := a.Archive(ctx, second, retention); err != nil {
		t.Fatal(err)
	}
	r := mustAcquire(t, s, req("arch"), store.Replayed)
	if string(r.Record.Result) != "first" {
		t.Fatalf("archive over a settled record replaced it: %q", r.Record.Result)
	}
	// A later owner's larger fence replaces the first result.
	later := rec
	later.Fence, later.Result = 8, []byte("later owner")
	if err := a.Archive(ctx, later, retention); err != nil {
		t.Fatal(err)
	}
	if r := mustAcquire(t, s, req("arch"), store.Replayed); string(r.Record.Result) != "later owner" || r.Record.Fence != 8 {
		t.Fatalf("archive with a larger fence: %q fence %d", r.Record.Result, r.Record.Fence)
	}
	// Over an in-flight record, the archived result wins.
	mustAcquire(t, s, req("busy"), store.Acquired)
	busy := rec
	busy.Key, busy.State, busy.Result = "busy", store.StateFailed, []byte("declined")
	if err := a.Archive(ctx, busy, retention); err != nil {
		t.Fatal(err)
	}
	if r := mustAcquire(t, s, req("busy"), store.Replayed); r.Record.State != store.StateFailed || string(r.Record.Result) != "declined" {
		t.Fatalf("archived failure: %+v", r.Record)
	}
	bad := rec
	bad.State = store.StateInFlight
	if err := a.Archive(ctx, bad, retention); err == nil {
		t.Fatal("archived an in-flight record")
	}
	// A tombstone (released) with fence 8 removes the result of fence 8 and
	// keeps that generation's late archive out; a later fence passes.
	tomb := store.Record{Key: "arch", State: store.StateReleased, Fence: 8}
	if err := a.Archive(ctx, tomb, retention); err != nil {
		t.Fatal(err)
	}
	late := later
	late.Result = []byte("late archive of a deleted generation")
	if err := a.Archive(ctx, late, retention); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "arch"); err != nil || rec.State != store.StateReleased || len(rec.Result) != 0 {
		t.Fatalf("after the tombstone and a late archive of its fence: %+v %v", rec, err)
	}
	next := rec
	next.Fence, next.Result = 9, []byte("next generation")
	if err := a.Archive(ctx, next, retention); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "arch"); err != nil || rec.State != store.StateCompleted || string(rec.Result) != "next generation" {
		t.Fatalf("a larger fence over the tombstone: %+v %v", rec, err)
	}
	// An older tombstone does not remove a newer generation's result.
	if err := a.Archive(ctx, store.Record{Key: "arch", State: store.StateReleased, Fence: 8}, retention); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "arch"); err != nil || rec.State != store.StateCompleted || rec.Fence != 9 {
		t.Fatalf("an older tombstone replaced a newer result: %+v %v", rec, err)
	}
}

func testGuardCacheCompact(t *testing.T, s store.Store) {
	ctx := context.Background()
	g, err := idem.NewGuard(idem.Config{Store: s, CompactKeys: true, CacheSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "tenant-a", ID: strings.Repeat("order-", 40)}
	runs := 0
	work := func(ctx context.Context, fence uint64) ([]byte, error) { runs++; return []byte("v"), nil }
	opts := &idem.RunOptions{Fingerprint: "fp"}
	first, err := g.Run(ctx, key, opts, work)
	if err != nil || first.Outcome != store.Acquired || first.Cached {
		t.Fatalf("first run: %+v %v", first, err)
	}
	// The store holds the compact key only.
	rec, err := s.Get(ctx, key.Storage(true))
	if err != nil || rec.State != store.StateCompleted {
		t.Fatalf("compact record: %+v %v", rec, err)
	}
	if _, err := s.Get(ctx, key.Storage(false)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("raw key stored too: %v", err)
	}
	second, err := g.Run(ctx, key, opts, work)
	if err != nil || second.Outcome != store.Replayed || !second.Cached || string(second.Value) != "v" {
		t.Fatalf("cached replay: %+v %v", second, err)
	}
	// A guard without a cache gets the replay from the store.
	g2, _ := idem.NewGuard(idem.Config{Store: s, CompactKeys: true})
	third, err := g2.Run(ctx, key, opts, work)
	if err != nil || third.Outcome != store.Replayed || third.Cached {
		t.Fatalf("store replay: %+v %v", third, err)
	}
	if mm, err := g.Run(ctx, key, &idem.RunOptions{Fingerprint: "other"}, work); err != nil || mm.Outcome != store.Mismatch {
		t.Fatalf("cached mismatch: %+v %v", mm, err)
	}
	if runs != 1 {
		t.Fatalf("work ran %d times", runs)
	}
}

// A generation of a key ends when its record is deleted, swept or expires.
// The next generation's fences must be larger than every fence of the
// earlier ones, or a zombie of the old generation could settle the new
// owner's record (and fool business writes conditioned on the fence).
func checkNewGeneration(t *testing.T, s store.Store, key string, old uint64) {
	t.Helper()
	ctx := context.Background()
	cur := mustAcquire(t, s, req(key), store.Acquired)
	if cur.Fence <= old {
		t.Fatalf("fence of the new generation %d is not larger than the old generation's %d", cur.Fence, old)
	}
	for op, err := range map[string]error{
		"Heartbeat": s.Heartbeat(ctx, key, old, longLease),
		"Complete":  s.Complete(ctx, key, old, []byte("zombie"), retention),
		"Fail":      s.Fail(ctx, key, old, []byte("zombie"), retention),
		"Release":   s.Release(ctx, key, old),
	} {
		if !errors.Is(err, store.ErrStaleFence) {
			t.Errorf("%s with the old generation's fence %d: err = %v, want ErrStaleFence", op, old, err)
		}
	}
	rec, err := s.Get(ctx, key)
	if err != nil || rec.State != store.StateInFlight || rec.Fence != cur.Fence {
		t.Fatalf("the old generation's calls changed the record: %+v, %v", rec, err)
	}
	if err := s.Complete(ctx, key, cur.Fence, []byte("new"), retention); err != nil {
		t.Fatalf("the new owner's Complete: %v", err)
	}
}

func testFenceAcrossDelete(t *testing.T, s store.Store) {
	ctx := context.Background()
	// An owner still running (in flight) when an operator deletes the key.
	a := mustAcquire(t, s, req("live"), store.Acquired)
	if err := s.Delete(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	checkNewGeneration(t, s, "live", a.Fence)
	// A completed key deleted, re-run, deleted again: fences keep growing.
	b := mustAcquire(t, s, req("done"), store.Acquired)
	if err := s.Complete(ctx, "done", b.Fence, []byte("v"), retention); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	checkNewGeneration(t, s, "done", b.Fence)
	rec, err := s.Get(ctx, "done")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	checkNewGeneration(t, s, "done", rec.Fence)
	// Generations in quick succession, many within one millisecond (a
	// store whose clock has milliseconds must still tell them apart).
	last := uint64(0)
	for i := range 100 {
		g := mustAcquire(t, s, req("quick"), store.Acquired)
		if g.Fence <= last {
			t.Fatalf("generation %d of a key deleted after each claim: fence %d, the one before %d", i, g.Fence, last)
		}
		last = g.Fence
		if err := s.Delete(ctx, "quick"); err != nil {
			t.Fatal(err)
		}
	}
}

func testFenceAcrossSweep(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := mustAcquire(t, s, req("k"), store.Acquired)
	if err := s.Complete(ctx, "k", a.Fence, []byte("v"), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	pass(s, 150*time.Millisecond)
	if _, err := s.Sweep(ctx, 0); err != nil {
		t.Fatal(err)
	}
	checkNewGeneration(t, s, "k", a.Fence)
}

func testFenceAcrossExpiry(t *testing.T, s store.Store) {
	// An owner whose lease and retention both ran out (a long GC pause): the
	// record expires unswept (or by the backend's TTL) and the key is new.
	r := req("k")
	r.Lease, r.Retention = shortLease, shortLease
	a := mustAcquire(t, s, r, store.Acquired)
	pass(s, shortLease+100*time.Millisecond)
	checkNewGeneration(t, s, "k", a.Fence)
}

// testSettlePastRetention: a record past its retention is gone, whether or
// not the backend has deleted it yet, so its owner can no longer settle or
// heartbeat it: the answer is ErrStaleFence on every backend.
func testSettlePastRetention(t *testing.T, s store.Store) {
	ctx := context.Background()
	r := req("k")
	r.Lease, r.Retention = shortLease, shortLease
	ops := []string{"Complete", "Fail", "Release", "Heartbeat"}
	fences := map[string]uint64{}
	for _, op := range ops {
		r.Key = "k-" + op
		fences[op] = mustAcquire(t, s, r, store.Acquired).Fence
	}
	pass(s, shortLease+100*time.Millisecond)
	for _, op := range ops {
		key, fence := "k-"+op, fences[op]
		var err error
		switch op {
		case "Complete":
			err = s.Complete(ctx, key, fence, []byte("late"), retention)
		case "Fail":
			err = s.Fail(ctx, key, fence, []byte("late"), retention)
		case "Release":
			err = s.Release(ctx, key, fence)
		case "Heartbeat":
			err = s.Heartbeat(ctx, key, fence, longLease)
		}
		if !errors.Is(err, store.ErrStaleFence) {
			t.Errorf("%s past the record's retention: err = %v, want ErrStaleFence", op, err)
		}
		if rec, err := s.Get(ctx, key); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s past the record's retention revived it: %+v, %v", op, rec, err)
		}
	}
}

// testPoisonKeepsRetention: poisoning never shortens how long the record is
// kept; it extends it to at least now + the request's retention.
func testPoisonKeepsRetention(t *testing.T, s store.Store) {
	ctx := context.Background()
	r := req("k")
	r.MaxAttempts = 1
	a := mustAcquire(t, s, r, store.Acquired)
	before := a.Record.ExpiresAt
	if err := s.Release(ctx, "k", a.Fence); err != nil {
		t.Fatal(err)
	}
	short := r
	short.Retention = time.Second
	p := mustAcquire(t, s, short, store.Poisoned)
	if p.Record.ExpiresAt.Before(before) {
		t.Fatalf("poisoning shortened the expiry from %v to %v", before, p.Record.ExpiresAt)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.State != store.StatePoisoned || rec.ExpiresAt.Before(before) {
		t.Fatalf("poisoned record %+v, %v; want expiry at or after %v", rec, err, before)
	}
}

// testUnclaim: Unclaim (store.Unclaimer) gives a claim back like Release
// and takes back the attempt it counted: with MaxAttempts 1 the key is
// acquired again, not poisoned. A stale fence and a second Unclaim are
// refused; a Release after it counts as before.
func testUnclaim(t *testing.T, s store.Store) {
	u, ok := s.(store.Unclaimer)
	if !ok {
		t.Fatalf("%T does not implement store.Unclaimer (Capabilities.Unclaims)", s)
	}
	ctx := context.Background()
	r := req("k")
	r.MaxAttempts = 1
	a := mustAcquire(t, s, r, store.Acquired)
	if err := u.Unclaim(ctx, "k", a.Fence+1); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("Unclaim with another fence: %v, want ErrStaleFence", err)
	}
	if err := u.Unclaim(ctx, "k", a.Fence); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.State != store.StateReleased || rec.Attempts != 0 {
		t.Fatalf("after Unclaim: %+v, %v; want released with 0 attempts", rec, err)
	}
	if err := u.Unclaim(ctx, "k", a.Fence); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("a second Unclaim: %v, want ErrStaleFence", err)
	}
	b := mustAcquire(t, s, r, store.Acquired)
	if b.Record.Attempts != 1 || b.Fence <= a.Fence {
		t.Fatalf("the claim after Unclaim: attempts %d, fence %d (before %d)", b.Record.Attempts, b.Fence, a.Fence)
	}
	if err := s.Release(ctx, "k", b.Fence); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, r, store.Poisoned)
}

// testPoisonClaim: PoisonClaim (store.Unclaimer) makes a claim's record
// poisoned in one step, as an acquisition at MaxAttempts finds it: the
// claim's attempt taken back, its fence, fingerprint and expiry kept; every
// later acquisition of the key is Poisoned (Mismatch for another
// fingerprint), and nothing fenced on the claim is accepted any more.
func testPoisonClaim(t *testing.T, s store.Store) {
	u, ok := s.(store.Unclaimer)
	if !ok {
		t.Fatalf("%T does not implement store.Unclaimer (Capabilities.Unclaims)", s)
	}
	ctx := context.Background()
	r := req("k")
	r.Lease = shortLease
	first := mustAcquire(t, s, r, store.Acquired)
	pass(s, shortLease+100*time.Millisecond) // its owner died: the key is taken over
	r.Lease = longLease
	a := mustAcquire(t, s, r, store.TakenOver)
	if err := u.PoisonClaim(ctx, "k", first.Fence); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("PoisonClaim with the earlier owner's fence: %v, want ErrStaleFence", err)
	}
	if err := u.PoisonClaim(ctx, "k", a.Fence); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.State != store.StatePoisoned || rec.Attempts != 1 || rec.Fence != a.Fence || rec.Fingerprint != "fp" {
		t.Fatalf("after PoisonClaim: %+v, %v; want poisoned, 1 attempt, fence %d", rec, err, a.Fence)
	}
	if rec.ExpiresAt.Before(a.Record.ExpiresAt.Add(-time.Second)) {
		t.Fatalf("after PoisonClaim the record expires at %v, before its claim's %v", rec.ExpiresAt, a.Record.ExpiresAt)
	}
	if err := u.PoisonClaim(ctx, "k", a.Fence); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("a second PoisonClaim: %v, want ErrStaleFence", err)
	}
	if err := s.Complete(ctx, "k", a.Fence, []byte("late"), retention); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("Complete after PoisonClaim: %v, want ErrStaleFence", err)
	}
	if err := s.Heartbeat(ctx, "k", a.Fence, longLease); !errors.Is(err, store.ErrStaleFence) {
		t.Fatalf("Heartbeat after PoisonClaim: %v, want ErrStaleFence", err)
	}
	mustAcquire(t, s, r, store.Poisoned)
	other := r
	other.Fingerprint = "other"
	mustAcquire(t, s, other, store.Mismatch)
}

// testDeleteUpTo: DeleteUpTo (store.FencedDeleter) removes a record whose
// fence is at most the one given, in flight or settled, and keeps one with
// a larger fence: the next generation of the key.
func testDeleteUpTo(t *testing.T, s store.Store) {
	d, ok := s.(store.FencedDeleter)
	if !ok {
		t.Fatalf("%T does not implement store.FencedDeleter (Capabilities.FencedDeletes)", s)
	}
	ctx := context.Background()
	if err := d.DeleteUpTo(ctx, "none", 1); err != nil {
		t.Fatalf("a key without a record: %v", err)
	}
	a := mustAcquire(t, s, req("k"), store.Acquired)
	for _, smaller := range []uint64{a.Fence - 1, 99} {
		if err := d.DeleteUpTo(ctx, "k", smaller); err != nil {
			t.Fatal(err)
		}
		if rec, err := s.Get(ctx, "k"); err != nil || rec.Fence != a.Fence {
			t.Fatalf("DeleteUpTo(%d) of a claim with fence %d: %+v, %v; want it kept", smaller, a.Fence, rec, err)
		}
	}
	if err := d.DeleteUpTo(ctx, "k", a.Fence); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeleteUpTo its own fence: %+v, %v; want it removed", rec, err)
	}
	b := mustAcquire(t, s, req("k"), store.Acquired)
	if b.Fence <= a.Fence {
		t.Fatalf("the next generation's fence %d, the deleted one's %d", b.Fence, a.Fence)
	}
	if err := s.Complete(ctx, "k", b.Fence, []byte("r"), retention); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteUpTo(ctx, "k", a.Fence); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, req("k"), store.Replayed)
	if err := d.DeleteUpTo(ctx, "k", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, req("k"), store.Acquired)
	// A claim poisoned by a takeover at the attempt limit: the poisoning is
	// newer than the claim, and DeleteUpTo of the claim keeps it (the
	// tiered store drops its momentary claims so, and must not drop a
	// poisoning that came after).
	r := req("p")
	r.MaxAttempts, r.Lease = 1, shortLease
	claim := mustAcquire(t, s, r, store.Acquired)
	pass(s, shortLease+100*time.Millisecond)
	mustAcquire(t, s, r, store.Poisoned)
	if err := d.DeleteUpTo(ctx, "p", claim.Fence); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "p"); err != nil || rec.State != store.StatePoisoned {
		t.Fatalf("DeleteUpTo(%d), the fence of the claim a takeover poisoned: %+v, %v; want the poisoned record kept", claim.Fence, rec, err)
	}
	mustAcquire(t, s, r, store.Poisoned)
}

// testReleaseKeepsRetention: a released record keeps its expiry (so its
// attempts keep counting toward MaxAttempts for the whole retention).
func testReleaseKeepsRetention(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := mustAcquire(t, s, req("k"), store.Acquired)
	if err := s.Release(ctx, "k", a.Fence); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.State != store.StateReleased || rec.ExpiresAt.Before(a.Record.ExpiresAt.Add(-time.Second)) {
		t.Fatalf("released record %+v, %v; want expiry about %v", rec, err, a.Record.ExpiresAt)
	}
}

// storedChecker archives through ArchiveStored and checks what it reports
// against what the store then holds: stored means the key now holds rec
// (its state and result, a fence no smaller), kept means it does not.
type storedChecker struct {
	t *testing.T
	a store.StoredArchiver
}

func (c storedChecker) Archive(ctx context.Context, rec store.Record, retention time.Duration) error {
	stored, err := c.a.ArchiveStored(ctx, rec, retention)
	if err != nil {
		return err
	}
	got, gerr := c.a.(store.Store).Get(ctx, rec.Key)
	holds := gerr == nil && got.State == rec.State && got.Fence >= rec.Fence && bytes.Equal(got.Result, rec.Result) // the fence never decreases
	if stored != holds {
		c.t.Fatalf("ArchiveStored(%s fence %d %q) reported stored=%v; the key then holds %+v, %v", rec.State, rec.Fence, rec.Result, stored, got, gerr)
	}
	return nil
}
