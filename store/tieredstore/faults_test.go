package tieredstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/sqlitestore"
	"github.com/idemgo/idem/store/storetest"
	"github.com/idemgo/idem/store/tieredstore"
)

// TestColdBlipNeverSkipsTheColdTier: a payment completed, its hot record
// gone (hot retention); a duplicate arrives while the cold tier is
// unreachable (fails closed), and its retry — the hot tier now holding the
// claim the failed acquisitions gave back — must still consult the cold
// tier and replay, not run the payment again.
func TestColdBlipNeverSkipsTheColdTier(t *testing.T) {
	s, proxy := proxiedColdTiers(t, 100*time.Millisecond)
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-1", Fingerprint: "fp", Lease: time.Minute, Retention: 72 * time.Hour}
	a, err := s.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	if err := s.Complete(ctx, "PAY-1", a.Fence, []byte("booked"), 72*time.Hour); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the hot tier forgets the completion
	if r := acquireAcrossAColdOutage(t, s, proxy, req); r.Outcome != store.Replayed || string(r.Record.Result) != "booked" {
		t.Fatalf("retry after the cold outage: %v %q — the payment would run again", r.Outcome, r.Record.Result)
	}
}

// TestReleasedAndPoisonedKeepFullRetention: unsettled records are not cut
// to the hot retention: a poisoned key stays poisoned, a released key keeps
// its attempts.
func TestReleasedAndPoisonedKeepFullRetention(t *testing.T) {
	s := newTiered(t, 100*time.Millisecond)
	ctx := context.Background()
	req := store.AcquireRequest{Key: "POISON", Fingerprint: "fp", Lease: 10 * time.Second, Retention: 72 * time.Hour, MaxAttempts: 1}
	a, err := s.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	if err := s.Release(ctx, "POISON", a.Fence); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Acquire(ctx, req); err != nil || p.Outcome != store.Poisoned {
		t.Fatal(p.Outcome, err)
	}
	time.Sleep(200 * time.Millisecond) // past the hot retention
	if p, err := s.Acquire(ctx, req); err != nil || p.Outcome != store.Poisoned {
		t.Fatalf("after the hot retention a poisoned key is %v, %v", p.Outcome, err)
	}
}

// TestCompletionSurvivesKill9BetweenTiers: a process completes a key and is
// killed with SIGKILL between the two writes of the completion. The
// completion must not be lost: once the dead owner's lease ends, the key is
// replayed with its result, also after the hot retention.
func TestCompletionSurvivesKill9BetweenTiers(t *testing.T) {
	const lease = time.Second
	prefix, coldPath := os.Getenv("IDEM_TIERED_PREFIX"), os.Getenv("IDEM_TIERED_COLD")
	if os.Getenv("IDEM_TIERED_CHILD") == "1" {
		s := openShared(t, prefix, coldPath)
		tieredstore.SetAfterArchive(s, func() {
			fmt.Println("BETWEEN")
			time.Sleep(time.Minute) // killed here
		})
		a, err := s.Acquire(context.Background(), store.AcquireRequest{Key: "PAY-9", Fingerprint: "fp", Lease: lease, Retention: 72 * time.Hour})
		if err != nil || a.Outcome != store.Acquired {
			fmt.Printf("ERROR %v %v\n", a.Outcome, err)
			os.Exit(1)
		}
		_ = s.Complete(context.Background(), "PAY-9", a.Fence, []byte("booked by the dead"), 72*time.Hour)
		os.Exit(3)
	}
	testenv.RedisClient(t).Close()
	prefix = testenv.RandomName("idemtest:") + ":"
	coldPath = filepath.Join(t.TempDir(), "cold.db")
	s := openShared(t, prefix, coldPath)
	child := testenv.StartChild(t, "TestCompletionSurvivesKill9BetweenTiers", "IDEM_TIERED_CHILD=1", "IDEM_TIERED_PREFIX="+prefix, "IDEM_TIERED_COLD="+coldPath)
	child.WaitFor(t, "BETWEEN") // the child is between the two writes
	child.Kill(t)
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-9", Fingerprint: "fp", Lease: time.Minute, Retention: 72 * time.Hour}
	deadline := time.Now().Add(lease + 10*time.Second)
	for {
		r, err := s.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if r.Outcome == store.InProgress && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond) // the dead owner's lease
			continue
		}
		if r.Outcome != store.Replayed || string(r.Record.Result) != "booked by the dead" {
			t.Fatalf("after the owner died between the tiers: %v %q — the completion was lost", r.Outcome, r.Record.Result)
		}
		break
	}
	time.Sleep(300 * time.Millisecond) // past the hot retention
	if r, err := s.Acquire(ctx, req); err != nil || r.Outcome != store.Replayed {
		t.Fatalf("after the hot retention: %v %v", r.Outcome, err)
	}
}

// openShared opens a tiered store of Redis (under prefix) over SQLite (at
// coldPath), both shared between processes, with a 200ms hot retention.
func openShared(t *testing.T, prefix, coldPath string) *tieredstore.Store {
	t.Helper()
	hot := testenv.OpenRedis(t, prefix)
	cold, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: coldPath})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cold.Close() })
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, HotRetention: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSettleNeverMeetsATakeover: an owner settles as its lease runs out; a
// duplicate arrives between the settle's hot check and its cold archive.
// Without the lease extension the duplicate took the key over, the archive
// still landed, the hot settle was refused — and the cold tier replayed
// the result of a settle its owner was told was refused.
func TestSettleNeverMeetsATakeover(t *testing.T) {
	hot := memstore.New(memstore.Config{SweepInterval: -1})
	cold := memstore.New(memstore.Config{SweepInterval: -1})
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, HotRetention: time.Hour, SettleTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-9", Fingerprint: "fp", Lease: 200 * time.Millisecond, Retention: time.Hour}
	a, err := s.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	var dup store.Acquisition
	tieredstore.SetBeforeArchive(s, func() {
		time.Sleep(time.Until(a.Record.LeaseUntil) + 100*time.Millisecond) // the original lease is over
		dup, err = s.Acquire(ctx, req)
		if err != nil {
			t.Error(err)
		}
	})
	settleErr := s.Complete(ctx, "PAY-9", a.Fence, []byte("first owner's booking"), time.Hour)
	tieredstore.SetBeforeArchive(s, nil)
	if dup.Outcome.Owns() {
		t.Errorf("a duplicate took the key over (%v) while its owner's archive was in flight", dup.Outcome)
	}
	later, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if settleErr != nil && later.Outcome == store.Replayed && string(later.Record.Result) == "first owner's booking" {
		t.Fatalf("the settle was refused (%v) but its result is replayed", settleErr)
	}
	if settleErr != nil {
		t.Fatalf("the owner's settle failed: %v", settleErr)
	}
}

// settleTiers returns a tiered store over a memory hot tier and a cold
// tier of coldKind ("memory" or "postgres") with a 2 s SettleTimeout, and
// its hot tier; closed when the test ends.
func settleTiers(t *testing.T, coldKind string) (*tieredstore.Store, *memstore.Store) {
	hot := memstore.New(memstore.Config{SweepInterval: -1})
	var cold store.Store = memstore.New(memstore.Config{SweepInterval: -1})
	if coldKind == "postgres" {
		cold = testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
	}
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, SettleTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, hot
}

// pauseTiers is settleTiers with a SettleTimeout of 200ms and the hot tier
// on a manual clock, so that a test can pause an owner past its lease
// extension by advancing it.
func pauseTiers(t *testing.T, coldKind string) (*tieredstore.Store, *storetest.ManualClock) {
	clock := storetest.NewManualClock(time.Now())
	hot := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	var cold store.Store = memstore.New(memstore.Config{SweepInterval: -1})
	if coldKind == "postgres" {
		cold = testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
	}
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, SettleTimeout: pauseSettle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, clock
}

const pauseSettle = 200 * time.Millisecond

// proxiedColdTiers returns a tiered store over a memory hot tier and a
// PostgreSQL cold tier reached through a proxy the test can cut.
func proxiedColdTiers(t *testing.T, hotRetention time.Duration) (*tieredstore.Store, *testenv.Proxy) {
	s, _, _, proxy := proxiedTiers(t, hotRetention)
	return s, proxy
}

// proxiedTiers is proxiedColdTiers with its tiers.
func proxiedTiers(t *testing.T, hotRetention time.Duration) (*tieredstore.Store, *memstore.Store, *pgstore.Store, *testenv.Proxy) {
	conn, proxy := testenv.PostgresProxy(t)
	cold := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{ConnString: conn})
	hot := memstore.New(memstore.Config{SweepInterval: -1})
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, HotRetention: hotRetention})
	if err != nil {
		t.Fatal(err)
	}
	return s, hot, cold, proxy
}

// acquireAcrossAColdOutage cuts the cold tier, checks that two
// acquisitions of req fail closed meanwhile, restores it and returns the
// first acquisition that gets an answer after.
func acquireAcrossAColdOutage(t *testing.T, s *tieredstore.Store, proxy *testenv.Proxy, req store.AcquireRequest) store.Acquisition {
	t.Helper()
	ctx := context.Background()
	proxy.Cut()
	for i := range 2 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		b, err := s.Acquire(cctx, req)
		cancel()
		if err == nil {
			t.Fatalf("acquisition %d during the cold outage: %v — a claim without the cold answer", i, b.Outcome)
		}
	}
	proxy.Restore()
	for {
		a, err := s.Acquire(ctx, req)
		if err == nil {
			return a
		}
		time.Sleep(50 * time.Millisecond) // the pool reconnects
	}
}

// completedInTheColdTierOnly claims and completes req's key ("booked"),
// then removes the hot copy, as the hot retention would.
func completedInTheColdTierOnly(t *testing.T, s *tieredstore.Store, hot store.Store, req store.AcquireRequest) {
	t.Helper()
	ctx := context.Background()
	a, err := s.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	if err := s.Complete(ctx, req.Key, a.Fence, []byte("booked"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := hot.Delete(ctx, req.Key); err != nil {
		t.Fatal(err)
	}
}

// memoryTiers returns a tiered store over two memory stores, and the tiers,
// with a SettleTimeout of 2s.
func memoryTiers(t *testing.T) (*tieredstore.Store, *memstore.Store, *memstore.Store) {
	hot := memstore.New(memstore.Config{SweepInterval: -1})
	cold := memstore.New(memstore.Config{SweepInterval: -1})
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, SettleTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, hot, cold
}

// settlesAndReplays completes req's key with fence and checks that the
// next request is replayed that result.
func settlesAndReplays(t *testing.T, s *tieredstore.Store, req store.AcquireRequest, fence uint64, result string) {
	t.Helper()
	ctx := context.Background()
	if err := s.Complete(ctx, req.Key, fence, []byte(result), time.Hour); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Acquire(ctx, req); err != nil || r.Outcome != store.Replayed || string(r.Record.Result) != result {
		t.Fatalf("after the settle of fence %d: %v %q %v, want %q replayed", fence, r.Outcome, r.Record.Result, err, result)
	}
}

// TestDeleteDuringSettle: an operator deletes a key while its owner is
// between the settle's hot check and its cold archive. Found by the fault
// campaign: the archive landed after the cold delete, the hot settle was
// refused, and the cold tier replayed the refused settle's result. Now the
// delete leaves a tombstone that keeps the late archive out: the owner is
// refused and the key is new again.
func TestDeleteDuringSettle(t *testing.T) {
	for _, coldKind := range []string{"memory", "postgres"} {
		t.Run(coldKind, func(t *testing.T) {
			s, hot := settleTiers(t, coldKind)
			ctx := context.Background()
			req := store.AcquireRequest{Key: "PAY-7", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
			a, err := s.Acquire(ctx, req)
			if err != nil || a.Outcome != store.Acquired {
				t.Fatal(a.Outcome, err)
			}
			tieredstore.SetBeforeArchive(s, func() {
				if err := s.Delete(ctx, "PAY-7"); err != nil {
					t.Error(err)
				}
			})
			settleErr := s.Complete(ctx, "PAY-7", a.Fence, []byte("deleted owner's booking"), time.Hour)
			tieredstore.SetBeforeArchive(s, nil)
			if settleErr == nil {
				t.Fatal("the owner of a deleted key settled it")
			}
			if _, err := s.Get(ctx, "PAY-7"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Get after the delete: %v, want ErrNotFound", err)
			}
			b, err := s.Acquire(ctx, req)
			if err != nil || b.Outcome != store.Acquired || b.Fence <= a.Fence {
				t.Fatalf("after the delete the key must be new: %v fence %d (old %d), %v; result %q", b.Outcome, b.Fence, a.Fence, err, b.Record.Result)
			}
			// The next generation settles and is replayed from the cold tier.
			if err := s.Complete(ctx, "PAY-7", b.Fence, []byte("second booking"), time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := hot.Delete(ctx, "PAY-7"); err != nil { // the hot tier forgets (its retention)
				t.Fatal(err)
			}
			if r, err := s.Acquire(ctx, req); err != nil || r.Outcome != store.Replayed || string(r.Record.Result) != "second booking" {
				t.Fatalf("the next generation's result: %v %q %v", r.Outcome, r.Record.Result, err)
			}
		})
	}
}

// TestPauseLongerThanSettleTimeout: the owner's process stalls between its
// cold archive and its hot settle for longer than the settle's lease
// extension (CPU starvation, a stop-the-world pause), and a duplicate takes
// the key over meanwhile. Found by the fault campaign under load (seed
// 7748422120819492985): the hot settle was refused, the owner was told
// ErrStaleFence, and the cold tier kept replaying the refused settle's
// result. The owner now withdraws its archive (a tombstone of its fence)
// when the hot settle is refused, so the refused result is not replayed.
func TestPauseLongerThanSettleTimeout(t *testing.T) {
	hot := memstore.New(memstore.Config{SweepInterval: -1})
	cold := memstore.New(memstore.Config{SweepInterval: -1})
	const settle = 300 * time.Millisecond
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, HotRetention: time.Hour, SettleTimeout: settle})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-11", Fingerprint: "fp", Lease: 100 * time.Millisecond, Retention: time.Hour}
	a, err := s.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	var dup store.Acquisition
	tieredstore.SetAfterArchive(s, func() {
		time.Sleep(settle + 100*time.Millisecond) // past the extended lease: the pause
		dup, err = s.Acquire(ctx, req)
		if err != nil {
			t.Error(err)
		}
	})
	settleErr := s.Complete(ctx, "PAY-11", a.Fence, []byte("stalled owner's booking"), time.Hour)
	tieredstore.SetAfterArchive(s, nil)
	later, err := s.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// The owner's answer and what duplicates get must agree: a refused
	// settle is never replayed, an accepted one always is.
	replayed := later.Outcome == store.Replayed && string(later.Record.Result) == "stalled owner's booking"
	if settleErr != nil && replayed {
		t.Fatalf("the settle was refused (%v) but its result is replayed", settleErr)
	}
	if settleErr == nil && !replayed {
		t.Fatalf("the settle was accepted but a duplicate gets %v %q", later.Outcome, later.Record.Result)
	}
	if dup.Outcome == store.Replayed && settleErr != nil {
		t.Fatal("a duplicate was given the result while its owner was told the settle was refused")
	}
	// The new owner settles normally, and its result is the one replayed.
	if dup.Outcome.Owns() {
		if err := s.Complete(ctx, "PAY-11", dup.Fence, []byte("new owner's booking"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Acquire(ctx, req); err != nil || string(r.Record.Result) != "new owner's booking" {
			t.Fatalf("after the new owner's settle: %v %q %v", r.Outcome, r.Record.Result, err)
		}
	}
}

// TestDuplicateDuringDelete: a duplicate re-warming a completed key holds a
// momentary hot claim while an operator's Delete has already replaced the
// cold record with its tombstone (and not yet removed the hot copy). A
// second duplicate meeting that claim must not be told InProgress — no work
// runs under it, and the key is about to be gone — but to retry. Found by
// the fault campaign in CI (tiered, seed 9881422026823391970).
func TestDuplicateDuringDelete(t *testing.T) {
	s, hot, cold := memoryTiers(t)
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-9", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	completedInTheColdTierOnly(t, s, hot, req)
	// A duplicate's momentary claim, taken to re-warm the hot tier …
	rewarm, err := hot.Acquire(ctx, req)
	if err != nil || rewarm.Outcome != store.Acquired {
		t.Fatal(rewarm.Outcome, err)
	}
	// … and the first half of a Delete: the cold tombstone, carrying the
	// largest fence either tier holds.
	if err := cold.Archive(ctx, store.Record{Key: "PAY-9", State: store.StateReleased, Fence: rewarm.Fence}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, fp := range []string{"fp", "other fp"} {
		req.Fingerprint = fp
		got, err := s.Acquire(ctx, req)
		if err == nil {
			t.Fatalf("fingerprint %q: a duplicate during the Delete was told %v (fence %d), want an error to retry", fp, got.Outcome, got.Fence)
		}
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("fingerprint %q: %v, want ErrStoreUnavailable (retry)", fp, err)
		}
	}
	// Once the Delete has removed the hot copy, the key is new.
	if err := hot.Delete(ctx, "PAY-9"); err != nil {
		t.Fatal(err)
	}
	req.Fingerprint = "fp"
	if b, err := s.Acquire(ctx, req); err != nil || b.Outcome != store.Acquired || b.Fence <= rewarm.Fence {
		t.Fatalf("after the Delete: %v fence %d, %v", b.Outcome, b.Fence, err)
	}
}

// TestTakeoverOfAMomentaryClaim: a caller's acquisition claims the hot tier
// and then asks the cold one; when the lease ends before the cold answer
// comes back — the cold read is bounded by half the lease
// (TestSlowColdReadGivesTheClaimBack), so this takes a paused caller: here
// the cold tier stops answering while the hot tier's clock jumps past the
// lease — another caller takes the hot claim over. Nothing had run under it, and the first caller
// must not get a claim too: exactly one of them owns the key, the first
// one fails closed with a retryable error, and the one that took over is
// told TakenOver (the tier cannot tell a momentary claim from a dead
// owner's, so it reports what a takeover is: a claim whose lease ended).
func TestTakeoverOfAMomentaryClaim(t *testing.T) {
	schema := testenv.RandomName("idemtest_")
	conn, proxy := testenv.PostgresProxy(t)
	slowCold := testenv.OpenPostgres(t, schema, pgstore.Config{ConnString: conn})
	cold := testenv.OpenPostgres(t, schema, pgstore.Config{})
	clock := storetest.NewManualClock(time.Now())
	hot := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	first, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: slowCold})
	if err != nil {
		t.Fatal(err)
	}
	second, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := slowCold.Pool().Ping(ctx); err != nil { // a connection in the pool before the cut
		t.Fatal(err)
	}
	proxy.Stall()
	req := store.AcquireRequest{Key: "PAY-12", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	type answer struct {
		a   store.Acquisition
		err error
	}
	firstDone := make(chan answer, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		a, err := first.Acquire(cctx, req)
		firstDone <- answer{a, err}
	}()
	// The first caller's hot claim exists; its lease ends while the cold
	// tier keeps it waiting.
	testenv.Eventually(t, 10*time.Second, "the first caller's hot claim", func() error {
		rec, err := hot.Get(ctx, "PAY-12")
		if err == nil && rec.State != store.StateInFlight {
			err = fmt.Errorf("state %v", rec.State)
		}
		return err
	})
	clock.Advance(2 * time.Minute)
	b, err := second.Acquire(ctx, req)
	if err != nil || b.Outcome != store.TakenOver {
		t.Fatalf("the second caller: %v, %v; want TakenOver", b.Outcome, err)
	}
	proxy.Unstall()
	got := <-firstDone
	if got.err == nil {
		t.Fatalf("the first caller got %v (fence %d) while the second owns the key (fence %d)", got.a.Outcome, got.a.Fence, b.Fence)
	}
	if !errors.Is(got.err, store.ErrUnavailable) {
		t.Fatalf("the first caller: %v, want a retryable ErrStoreUnavailable", got.err)
	}
	if err := second.Complete(ctx, "PAY-12", b.Fence, []byte("booked"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if r, err := first.Acquire(ctx, req); err != nil || r.Outcome != store.Replayed || string(r.Record.Result) != "booked" {
		t.Fatalf("the first caller's retry: %v %q, %v; want the replay", r.Outcome, r.Record.Result, err)
	}
}

// TestDeleteAfterArchive: an operator deletes a key just after its owner's
// settle archived the result — after a duplicate was already replayed
// that result from the cold tier. Found by the fault campaign under load
// (seed 4005012456386975865): the hot settle found no record and the owner
// was told ErrStaleFence, a settle refused after its result was served.
// The settle took effect (then the key was deleted): the owner is told so.
// (TestDeleteDuringSettle is the other order: the delete's tombstone keeps
// the archive out, nothing is served, and the owner is refused.)
//
// With a new owner (CI's fault campaign, seed 165704188573814559): the key
// is also claimed anew before the owner's hot settle runs, which then meets
// the new claim — and the owner was told ErrStaleFence. The settle took
// effect before the delete all the same, and the new generation's claim is
// left alone.
func TestDeleteAfterArchive(t *testing.T) {
	for _, coldKind := range []string{"memory", "postgres"} {
		for _, newOwner := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/new-owner=%v", coldKind, newOwner), func(t *testing.T) {
				s, _ := settleTiers(t, coldKind)
				ctx := context.Background()
				req := store.AcquireRequest{Key: "PAY-13", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
				a, err := s.Acquire(ctx, req)
				if err != nil || a.Outcome != store.Acquired {
					t.Fatal(a.Outcome, err)
				}
				var dup, next store.Acquisition
				tieredstore.SetAfterArchive(s, func() {
					if dup, err = s.Acquire(ctx, req); err != nil {
						t.Error(err)
					}
					if err := s.Delete(ctx, "PAY-13"); err != nil {
						t.Error(err)
					}
					if newOwner {
						if next, err = s.Acquire(ctx, req); err != nil {
							t.Error(err)
						}
					}
				})
				settleErr := s.Complete(ctx, "PAY-13", a.Fence, []byte("booked"), time.Hour)
				tieredstore.SetAfterArchive(s, nil)
				if dup.Outcome != store.Replayed || string(dup.Record.Result) != "booked" {
					t.Fatalf("the duplicate before the delete: %v %q", dup.Outcome, dup.Record.Result)
				}
				if settleErr != nil {
					t.Fatalf("the owner was told %v after a duplicate was replayed its result", settleErr)
				}
				if !newOwner {
					next, err = s.Acquire(ctx, req)
				}
				if err != nil || next.Outcome != store.Acquired || next.Fence <= a.Fence {
					t.Fatalf("after the delete the key must be new: %v fence %d (old %d), %v", next.Outcome, next.Fence, a.Fence, err)
				}
				// The new generation owns the key: duplicates wait for it, and
				// its settle is the one replayed.
				if d, err := s.Acquire(ctx, req); err != nil || d.Outcome != store.InProgress {
					t.Fatalf("a duplicate during the new generation: %v %q %v", d.Outcome, d.Record.Result, err)
				}
				settlesAndReplays(t, s, req, next.Fence, "booked again")
			})
		}
	}
}

// TestPauseBeforeArchive: the owner stalls after the settle's lease
// extension and before its archive, for longer than the extension; a
// duplicate takes the key over, and the late archive lands beside the new
// claim. Then either another duplicate is replayed it before the owner's
// hot settle is refused ("served"), or the new owner settles first, its
// archive (a larger fence) replacing the paused owner's, which duplicates
// may have been replayed meanwhile ("superseded"). The paused owner must not
// be told ErrStaleFence ("refused, nothing changed") about a result that
// may have been served: it is told ErrSettleUncertain, and the new owner's
// work decides the record.
func TestPauseBeforeArchive(t *testing.T) {
	for _, coldKind := range []string{"memory", "postgres"} {
		for _, then := range []string{"served", "superseded"} {
			t.Run(coldKind+"/"+then, func(t *testing.T) {
				s, clock := pauseTiers(t, coldKind)
				ctx := context.Background()
				// The cold reads under the claims are bounded by half the
				// lease on the wall clock: a lease far shorter than the
				// manual advance, yet long enough for a loaded machine.
				req := store.AcquireRequest{Key: "PAY-15", Fingerprint: "fp", Lease: 500 * time.Millisecond, Retention: time.Hour}
				a, err := s.Acquire(ctx, req)
				if err != nil || a.Outcome != store.Acquired {
					t.Fatal(a.Outcome, err)
				}
				var taker, dup store.Acquisition
				tieredstore.SetBeforeArchive(s, func() {
					tieredstore.SetBeforeArchive(s, nil)     // once: the new owner may settle too
					clock.Advance(pauseSettle + time.Second) // the extended lease ends while the owner is paused
					if taker, err = s.Acquire(ctx, req); err != nil {
						t.Error(err)
					}
				})
				tieredstore.SetAfterArchive(s, func() {
					tieredstore.SetAfterArchive(s, nil)
					if then == "superseded" {
						if err := s.Complete(ctx, "PAY-15", taker.Fence, []byte("new owner's booking"), time.Hour); err != nil {
							t.Error(err)
						}
					} else if dup, err = s.Acquire(ctx, req); err != nil {
						t.Error(err)
					}
				})
				settleErr := s.Complete(ctx, "PAY-15", a.Fence, []byte("paused owner's booking"), time.Hour)
				if taker.Outcome != store.TakenOver {
					t.Fatalf("the takeover during the pause: %v", taker.Outcome)
				}
				if then == "served" && dup.Outcome != store.Replayed {
					t.Fatalf("the duplicate after the late archive: %v %q (the scenario needs the archive served)", dup.Outcome, dup.Record.Result)
				}
				if !errors.Is(settleErr, tieredstore.ErrSettleUncertain) {
					t.Fatalf("the paused owner was told %v, want ErrSettleUncertain", settleErr)
				}
				if then == "superseded" {
					if r, err := s.Acquire(ctx, req); err != nil || r.Outcome != store.Replayed || string(r.Record.Result) != "new owner's booking" {
						t.Fatalf("the record: %v %q %v", r.Outcome, r.Record.Result, err)
					}
					return
				}
				if d, err := s.Acquire(ctx, req); err != nil || d.Outcome != store.InProgress {
					t.Fatalf("a duplicate after the withdrawal: %v %q %v, want InProgress (the new owner's claim)", d.Outcome, d.Record.Result, err)
				}
				settlesAndReplays(t, s, req, taker.Fence, "new owner's booking")
			})
		}
	}
}

// TestAcquireDuringDelete: a request arrives while an operator's Delete is
// between its cold tombstone and its hot removal, with the hot tier holding
// nothing for the key (its copy past the hot retention). Found by the fault
// campaign (seed 16945938265051866408): the request was given a claim, the
// Delete then removed that claim, and the next request was given one too —
// two owners ran the same key. A request during a Delete must be told to
// retry (or keep its claim); never may two claims stand for one generation.
func TestAcquireDuringDelete(t *testing.T) {
	for _, coldKind := range []string{"memory", "postgres"} {
		t.Run(coldKind, func(t *testing.T) {
			s, hot := settleTiers(t, coldKind)
			ctx := context.Background()
			req := store.AcquireRequest{Key: "PAY-16", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
			completedInTheColdTierOnly(t, s, hot, req)
			var during store.Acquisition
			var duringErr error
			tieredstore.SetDuringDelete(s, func() { during, duringErr = s.Acquire(ctx, req) })
			if err := s.Delete(ctx, "PAY-16"); err != nil {
				t.Fatal(err)
			}
			tieredstore.SetDuringDelete(s, nil)
			after, err := s.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if duringErr == nil && during.Outcome.Owns() && after.Outcome.Owns() {
				t.Fatalf("two claims for one generation: %v (fence %d) during the Delete and %v (fence %d) after it", during.Outcome, during.Fence, after.Outcome, after.Fence)
			}
			if duringErr != nil && !errors.Is(duringErr, store.ErrUnavailable) {
				t.Fatalf("the request during the Delete: %v, want ErrStoreUnavailable (retry)", duringErr)
			}
			if duringErr == nil && during.Outcome.Owns() {
				if after.Outcome != store.InProgress {
					t.Fatalf("the claim taken during the Delete stands, yet a request after it got %v", after.Outcome)
				}
			} else if after.Outcome != store.Acquired {
				t.Fatalf("after the Delete the key must be new: %v %q", after.Outcome, after.Record.Result)
			}
		})
	}
}

// TestAcquireDuringDeleteOfAnUnknownKey: a Delete of a key neither tier
// holds, and a request for that key arriving just after the Delete read
// both tiers. The request's claim is the key's first generation; the
// Delete, which found nothing, must not remove it (before, it removed the
// hot key regardless, and the next request was given a second claim).
func TestAcquireDuringDeleteOfAnUnknownKey(t *testing.T) {
	s, _ := settleTiers(t, "memory")
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-18", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	var during store.Acquisition
	var duringErr error
	tieredstore.SetAfterDeleteReads(s, func() { during, duringErr = s.Acquire(ctx, req) })
	if err := s.Delete(ctx, "PAY-18"); err != nil {
		t.Fatal(err)
	}
	tieredstore.SetAfterDeleteReads(s, nil)
	if duringErr != nil || during.Outcome != store.Acquired {
		t.Fatalf("the request during the Delete: %v, %v", during.Outcome, duringErr)
	}
	if after, err := s.Acquire(ctx, req); err != nil || after.Outcome != store.InProgress {
		t.Fatalf("a request after the Delete: %v (fence %d, the first claim's %d), %v; want InProgress", after.Outcome, after.Fence, during.Fence, err)
	}
}

// TestRefusedSettleKeepsADeleteUnderWay: an owner's settle is refused while
// a Delete of its key is under way (the Delete's tombstone written, the hot
// record not yet removed). The refused settle withdraws its archive with a
// tombstone of its own fence — which must not replace the Delete's, marked
// as under way: until the Delete removed the hot record, a request must
// still be told to retry, not handed a claim the removal would take away.
func TestRefusedSettleKeepsADeleteUnderWay(t *testing.T) {
	s, hot, cold := memoryTiers(t)
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-19", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	a, err := s.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	tieredstore.SetBeforeArchive(s, func() {
		// The first half of a Delete: its tombstone, marked as under way …
		tomb := store.Record{Key: "PAY-19", State: store.StateReleased, Fence: a.Fence, Result: []byte(tieredstore.DeletingMark)}
		if err := cold.Archive(ctx, tomb, 2*time.Second); err != nil {
			t.Error(err)
		}
		// … and the owner's hot claim ends (released here), so its hot
		// settle is refused.
		if err := hot.Release(ctx, "PAY-19", a.Fence); err != nil {
			t.Error(err)
		}
	})
	settleErr := s.Complete(ctx, "PAY-19", a.Fence, []byte("booked"), time.Hour)
	tieredstore.SetBeforeArchive(s, nil)
	if !errors.Is(settleErr, store.ErrStaleFence) {
		t.Fatalf("the settle: %v, want ErrStaleFence (its archive was kept out)", settleErr)
	}
	if b, err := s.Acquire(ctx, req); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a request while the Delete is under way: %v (fence %d), %v; want ErrStoreUnavailable (retry)", b.Outcome, b.Fence, err)
	}
}

// TestColdOutageNeverPoisons: a request whose acquisition fails closed —
// the cold tier unreachable after the hot claim was taken — ran nothing,
// so it must not count as an attempt: with MaxAttempts 1, the retry after
// the outage runs the work. Before, the hot claim was given back with
// Release, which counts it, and the retry was told Poisoned — a store
// outage turned into a permanent refusal of work that never ran.
func TestColdOutageNeverPoisons(t *testing.T) {
	s, proxy := proxiedColdTiers(t, time.Hour)
	req := store.AcquireRequest{Key: "PAY-20", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour, MaxAttempts: 1}
	if a := acquireAcrossAColdOutage(t, s, proxy, req); a.Outcome != store.Acquired {
		t.Fatalf("after the outage: %v (attempts %d), want Acquired: nothing ran during the outage", a.Outcome, a.Record.Attempts)
	}
}

// TestRewarmAcrossADelete: a duplicate of a completed key whose hot copy
// is gone claims the hot key and reads the cold record, then pauses before
// it re-warms the hot tier; meanwhile an operator deletes the key (the
// Delete read both tiers before the duplicate's claim). After the Delete,
// the deleted result must never be replayed: the Delete's hot removal must
// take the duplicate's claim too, so its re-warm is refused. (Found by the
// fault campaign when a Delete removed only the hot records up to the fence
// it had read: the claim, with a larger fence, survived, and the re-warm put
// the deleted result back.)
func TestRewarmAcrossADelete(t *testing.T) {
	for _, coldKind := range []string{"memory", "postgres"} {
		t.Run(coldKind, func(t *testing.T) {
			s, hot := settleTiers(t, coldKind)
			ctx := context.Background()
			req := store.AcquireRequest{Key: "PAY-21", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
			completedInTheColdTierOnly(t, s, hot, req)
			paused, resume, done := make(chan struct{}), make(chan struct{}), make(chan store.Acquisition)
			tieredstore.SetAfterColdSettled(s, func() { close(paused); <-resume })
			tieredstore.SetAfterDeleteReads(s, func() {
				go func() {
					dup, err := s.Acquire(ctx, req)
					if err != nil {
						t.Error(err)
					}
					done <- dup
				}()
				<-paused
			})
			if err := s.Delete(ctx, "PAY-21"); err != nil {
				t.Fatal(err)
			}
			tieredstore.SetAfterDeleteReads(s, nil)
			close(resume)
			if dup := <-done; dup.Outcome != store.Replayed {
				t.Fatalf("the duplicate, concurrent with the Delete: %v, want Replayed", dup.Outcome)
			}
			tieredstore.SetAfterColdSettled(s, nil)
			if after, err := s.Acquire(ctx, req); err != nil || after.Outcome != store.Acquired {
				t.Fatalf("a request after the Delete: %v %q, %v; want Acquired (the key deleted)", after.Outcome, after.Record.Result, err)
			}
		})
	}
}

// TestTwoDeletesAtOnce: two operators (two processes, each with its own
// tiered store over the same tiers) delete one completed key at once, the
// second one's reads before the first one's end, and a request claims the
// key just after the first Delete (the key's next generation). Without the
// delete lock, the first Delete cleared the second one's mark, and the
// second one's hot removal then took the new claim away: the next request
// was handed a second claim — two owners of one key. Now the second Delete
// waits for the first: the new claim stands.
func TestTwoDeletesAtOnce(t *testing.T) {
	hot := memstore.New(memstore.Config{SweepInterval: -1})
	cold := memstore.New(memstore.Config{SweepInterval: -1})
	var tiers [2]*tieredstore.Store
	for i := range tiers {
		s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, SettleTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		tiers[i] = s
	}
	first, second := tiers[0], tiers[1]
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-22", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	a, err := first.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	settlesAndReplays(t, first, req, a.Fence, "booked")

	// The first Delete, and a claim after it, while the second Delete is
	// between its reads and its hot removal: the second waits until the
	// first has either finished or found the lock held.
	var claim store.Acquisition
	ended, waits := make(chan struct{}), make(chan struct{})
	var once sync.Once
	tieredstore.SetDeleteLockHeld(first, func() { once.Do(func() { close(waits) }) })
	tieredstore.SetDuringDelete(second, func() {
		go func() {
			defer close(ended)
			if err := first.Delete(ctx, "PAY-22"); err != nil {
				t.Error(err)
			}
			var err error
			if claim, err = first.Acquire(ctx, req); err != nil || claim.Outcome != store.Acquired {
				t.Errorf("a request after the first Delete: %v, %v; want Acquired", claim.Outcome, err)
			}
		}()
		select {
		case <-ended:
		case <-waits:
		}
	})
	if err := second.Delete(ctx, "PAY-22"); err != nil {
		t.Fatal(err)
	}
	<-ended
	if next, err := first.Acquire(ctx, req); err != nil || next.Outcome != store.InProgress {
		t.Fatalf("a request after both Deletes: %v (fence %d), %v; want InProgress — the claim %d taken after the first Delete is in flight",
			next.Outcome, next.Fence, err, claim.Fence)
	}
	if err := first.Complete(ctx, "PAY-22", claim.Fence, []byte("booked again"), time.Hour); err != nil {
		t.Fatalf("the new generation's owner: %v", err)
	}
}

// TestClaimBetweenDeleteReadsAndMark: a key released by its owner (nothing
// settled) is deleted, and a request claims it after the Delete read the
// tiers but before its tombstone — its cold read sees nothing settled, so
// the claim is the key's next run — then completes while the Delete is
// under way. The Delete's hot removal takes that claim, so its tombstone
// must cover the claim's fence: before, it carried only the fence the
// Delete had read, the completion's archive (a larger fence) replaced it,
// and after the Delete the key replayed the completion the Delete had
// removed. (Found by the campaign with two Deletes of one key at once: the
// second, waiting for the first, read the key just before such a claim.)
func TestClaimBetweenDeleteReadsAndMark(t *testing.T) {
	s, _, _ := memoryTiers(t)
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-23", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	a, err := s.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	if err := s.Release(ctx, "PAY-23", a.Fence); err != nil {
		t.Fatal(err)
	}
	var claim store.Acquisition
	var completeErr error
	tieredstore.SetAfterDeleteReads(s, func() {
		var err error
		if claim, err = s.Acquire(ctx, req); err != nil || !claim.Outcome.Owns() {
			t.Fatalf("a request between the Delete's reads and its tombstone: %v, %v; want a claim", claim.Outcome, err)
		}
	})
	tieredstore.SetDuringDelete(s, func() {
		completeErr = s.Complete(ctx, "PAY-23", claim.Fence, []byte("second run"), time.Hour)
	})
	if err := s.Delete(ctx, "PAY-23"); err != nil {
		t.Fatal(err)
	}
	tieredstore.SetAfterDeleteReads(s, nil)
	tieredstore.SetDuringDelete(s, nil)
	if after, err := s.Acquire(ctx, req); err != nil || after.Outcome != store.Acquired {
		t.Fatalf("a request after the Delete: %v %q, %v (the claim's Complete during the Delete: %v); want Acquired — the Delete removed that claim",
			after.Outcome, after.Record.Result, err, completeErr)
	}
}

// settledInAManualColdTier returns a tiered store on two memory tiers that
// share a manual clock, with key completed (fingerprint "A") in the cold
// tier only, for 10 s more.
func settledInAManualColdTier(t *testing.T, key string) (*tieredstore.Store, *storetest.ManualClock) {
	t.Helper()
	clock := storetest.NewManualClock(time.Now())
	hot := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	cold := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
	if err != nil {
		t.Fatal(err)
	}
	done := store.Record{Key: key, State: store.StateCompleted, Fence: 1, Fingerprint: "A", Attempts: 1, Result: []byte("done")}
	if err := cold.Archive(context.Background(), done, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return s, clock
}

// TestMismatchDropsOnlyItsOwnClaim: a request with another fingerprint
// claims the hot tier, finds the key settled in the cold tier and drops its
// claim. If its cold read outlasted its lease, another request may have
// taken the claim over meanwhile and, the cold record having expired since,
// own the key and run the work. Dropping the claim with an unconditional
// hot Delete took that owner's claim away, and the next request was handed
// a second one: two owners at once. Only the request's own claim may go.
func TestMismatchDropsOnlyItsOwnClaim(t *testing.T) {
	ctx := context.Background()
	s, clock := settledInAManualColdTier(t, "PAY-23")
	other := store.AcquireRequest{Key: "PAY-23", Fingerprint: "B", Lease: time.Second, Retention: time.Hour}
	var owner store.Acquisition
	tieredstore.SetAfterColdSettled(s, func() {
		tieredstore.SetAfterColdSettled(s, nil)
		// The cold read took long: the lease and the cold record ended.
		clock.Advance(11 * time.Second)
		var err error
		if owner, err = s.Acquire(ctx, other); err != nil || !owner.Outcome.Owns() {
			t.Fatalf("the request after the first one's lease: %v, %v; want a claim (the cold record expired)", owner.Outcome, err)
		}
	})
	if a, err := s.Acquire(ctx, other); err != nil || a.Outcome != store.Mismatch {
		t.Fatalf("the first request: %v, %v; want Mismatch (its cold read found the other fingerprint)", a.Outcome, err)
	}
	if next, err := s.Acquire(ctx, other); err != nil || next.Outcome != store.InProgress {
		t.Fatalf("a request while the key's owner (fence %d) works: %v (fence %d), %v; want InProgress", owner.Fence, next.Outcome, next.Fence, err)
	}
}

// TestMismatchLeavesAPoisoningOfItsClaim: as TestMismatchDropsOnlyItsOwnClaim,
// but the request that came while the cold read outlasted the lease had a
// MaxAttempts of 1: it poisoned the claim instead of taking it over. The
// poisoning kept the claim's fence, so the first request's drop of "only
// its own claim" (DeleteUpTo its fence) removed the poisoned record, and
// the next request was handed a claim of a key just answered Poisoned
// (found by a tiered buckets campaign, seed 15210785027769609757).
// Poisoning now takes a fence of its own.
func TestMismatchLeavesAPoisoningOfItsClaim(t *testing.T) {
	ctx := context.Background()
	s, clock := settledInAManualColdTier(t, "PAY-25")
	other := store.AcquireRequest{Key: "PAY-25", Fingerprint: "B", Lease: time.Second, Retention: time.Hour}
	once := other
	once.MaxAttempts = 1
	tieredstore.SetAfterColdSettled(s, func() {
		tieredstore.SetAfterColdSettled(s, nil)
		// The cold read took long: the lease and the cold record ended.
		clock.Advance(11 * time.Second)
		if a, err := s.Acquire(ctx, once); err != nil || a.Outcome != store.Poisoned {
			t.Fatalf("a request with MaxAttempts 1 after the first one's lease: %v, %v; want Poisoned (the claim counted its attempt)", a.Outcome, err)
		}
	})
	if a, err := s.Acquire(ctx, other); err != nil || a.Outcome != store.Mismatch {
		t.Fatalf("the first request: %v, %v; want Mismatch (its cold read found the other fingerprint)", a.Outcome, err)
	}
	if next, err := s.Acquire(ctx, once); err != nil || next.Outcome != store.Poisoned {
		t.Fatalf("a request after the key was answered Poisoned: %v (fence %d), %v; want Poisoned", next.Outcome, next.Fence, err)
	}
}

// TestGetOfAKeySettledInTheColdTier: a key completed in the cold tier only
// (its hot copy gone), claimed for a moment by a duplicate that then failed
// closed in a cold outage: the claim given back leaves a released hot
// record. Get answered that record — a released key where Acquire replays
// the completion. Found by the fault campaign once it read keys (seed
// 13863722093483404193). Now Get asks the cold tier behind an unsettled hot
// record: the completion, or the cold tier's error while it cannot say.
func TestGetOfAKeySettledInTheColdTier(t *testing.T) {
	ctx := context.Background()
	s, hot, _, proxy := proxiedTiers(t, time.Hour)
	req := store.AcquireRequest{Key: "PAY-24", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	completedInTheColdTierOnly(t, s, hot, req)
	proxy.Cut()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if a, err := s.Acquire(cctx, req); err == nil {
		t.Fatalf("an acquisition during the cold outage: %v, want an error", a.Outcome)
	}
	if rec, err := hot.Get(ctx, req.Key); err != nil || rec.State != store.StateReleased {
		t.Fatalf("the hot tier after the failed acquisition: %+v, %v; want its claim given back", rec, err)
	}
	rec, err := s.Get(cctx, req.Key)
	cancel()
	if err == nil {
		t.Fatalf("Get during the cold outage: %v %q; want an error (the cold tier cannot say)", rec.State, rec.Result)
	}
	proxy.Restore()
	for {
		rec, err = s.Get(ctx, req.Key)
		if err == nil || !errors.Is(err, store.ErrUnavailable) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the pool reconnects
	}
	if err != nil || rec.State != store.StateCompleted || string(rec.Result) != "booked" {
		t.Fatalf("Get after the outage: %v %q, %v; want the completion", rec.State, rec.Result, err)
	}
}

// TestSlowColdReadGivesTheClaimBack: an acquisition holds a hot claim while
// it reads the cold tier. A cold read that outlasted the lease let another
// request take that claim over, and the takeover counted a second attempt
// though nothing had run under the first claim: with MaxAttempts 1 the key
// was poisoned without ever running (a message lost). The cold read is now
// bounded by half the lease: past it, the acquisition gives its claim back
// with its attempt and fails closed, and the next request runs the work.
func TestSlowColdReadGivesTheClaimBack(t *testing.T) {
	ctx := context.Background()
	s, hot, cold, proxy := proxiedTiers(t, time.Hour)
	if err := cold.Pool().Ping(ctx); err != nil { // a connection in the pool before the stall
		t.Fatal(err)
	}
	req := store.AcquireRequest{Key: "PAY-25", Fingerprint: "fp", Lease: 400 * time.Millisecond, Retention: time.Hour, MaxAttempts: 1}
	proxy.Stall()
	t.Cleanup(proxy.Unstall)
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, req)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("the acquisition whose cold read stalled: %v, want ErrStoreUnavailable", err)
		}
	case <-time.After(10 * req.Lease):
		t.Fatalf("the acquisition still waits on the cold tier after %v, holding a claim of a %v lease", 10*req.Lease, req.Lease)
	}
	if rec, err := hot.Get(ctx, req.Key); err != nil || rec.State != store.StateReleased || rec.Attempts != 0 {
		t.Fatalf("the hot record after the failed acquisition: %+v, %v; want released with no attempt counted", rec, err)
	}
	proxy.Unstall()
	for {
		a, err := s.Acquire(ctx, req)
		if errors.Is(err, store.ErrUnavailable) {
			time.Sleep(50 * time.Millisecond) // the pool reconnects
			continue
		}
		if err != nil || a.Outcome != store.Acquired || a.Record.Attempts != 1 {
			t.Fatalf("the next request: %v (attempts %d), %v; want Acquired, its first attempt", a.Outcome, a.Record.Attempts, err)
		}
		break
	}
}

// TestPoisonOfACompletedKeyReplays: a key completed, its hot copy gone
// (hot retention), the completion in the cold tier. A duplicate's momentary
// hot claim — taken to consult the cold tier — is held past its lease (the
// caller paused before it re-warms the hot tier), and the next duplicate,
// with MaxAttempts 1, finds that claim counted as the key's one attempt:
// the hot tier poisons the key. Found by the fault campaign under heavy CPU
// load (seed 12948384746846617620): the duplicate was told Poisoned — dead-
// lettered — though the key had run and completed. The answer for a
// completed key is its result: the duplicate is replayed, and the poisoned
// hot copy is dropped so that the next one re-warms the hot tier.
func TestPoisonOfACompletedKeyReplays(t *testing.T) {
	ctx := context.Background()
	clock, hot, paused, s := twoOverManualTiers(t, func(hot *memstore.Store) store.Store { return hot })
	req := store.AcquireRequest{Key: "PAY-26", Fingerprint: "fp", Lease: time.Minute, Retention: 24 * time.Hour, MaxAttempts: 1}
	completedInTheColdTierOnly(t, s, hot, req)

	atRewarm, resume := make(chan struct{}), make(chan struct{})
	tieredstore.SetAfterColdSettled(paused, func() {
		close(atRewarm)
		<-resume
	})
	pausedDone := make(chan error, 1)
	go func() {
		a, err := paused.Acquire(ctx, req)
		if err == nil && (a.Outcome != store.Replayed || string(a.Record.Result) != "booked") {
			err = fmt.Errorf("%v %q, want the replay", a.Outcome, a.Record.Result)
		}
		pausedDone <- err
	}()
	<-atRewarm // its momentary claim holds the key's one attempt
	clock.Advance(2 * req.Lease)
	for i := range 2 {
		a, err := s.Acquire(ctx, req)
		if err != nil || a.Outcome != store.Replayed || string(a.Record.Result) != "booked" {
			t.Fatalf("duplicate %d of the completed key: %v %q, %v; want the replay", i, a.Outcome, a.Record.Result, err)
		}
	}
	if rec, err := s.Get(ctx, req.Key); err != nil || rec.State != store.StateCompleted {
		t.Fatalf("Get of the completed key: %v, %v; want completed", rec.State, err)
	}
	close(resume)
	if err := <-pausedDone; err != nil {
		t.Fatalf("the paused duplicate: %v", err)
	}
	if a, err := s.Acquire(ctx, req); err != nil || a.Outcome != store.Replayed {
		t.Fatalf("a duplicate after the pause: %v, %v; want the replay", a.Outcome, err)
	}
	if rec, err := hot.Get(ctx, req.Key); err != nil || rec.State != store.StateCompleted {
		t.Fatalf("the hot tier: %v, %v; want it re-warmed with the completion", rec.State, err)
	}
}

// TestRewarmNeverOutlivesTheColdRecord: a duplicate that finds the result
// only in the cold tier re-warms the hot tier with it; the hot copy must
// expire no later than the cold record, or the key is replayed past its
// retention. Found twice by the campaign: the copy was kept for the cold
// record's remaining time counted before the hot write (seed
// 12637830274293705606: replays 6-12 ms past the retention), so it is kept
// 100 ms less; and a write held longer than that (a stalled connection)
// made it outlive the record by the excess (seed 3883689393448664545: 294
// ms), so a re-warm whose write took longer than its slack drops the copy
// it wrote, and the next duplicate reads the cold tier again.
func TestRewarmNeverOutlivesTheColdRecord(t *testing.T) {
	for _, hold := range []time.Duration{0, 400 * time.Millisecond} {
		t.Run(fmt.Sprintf("held %v", hold), func(t *testing.T) {
			hot := memstore.New(memstore.Config{SweepInterval: -1})
			cold := memstore.New(memstore.Config{SweepInterval: -1})
			s, err := tieredstore.New(tieredstore.Config{Hot: heldSettles{hot, hold}, Cold: cold, HotRetention: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			rec := store.Record{Key: "PAY-12", State: store.StateCompleted, Fence: 5, Fingerprint: "fp", Attempts: 1, Result: []byte("booked")}
			if err := cold.Archive(ctx, rec, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			req := store.AcquireRequest{Key: "PAY-12", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
			for i := range 2 { // the first re-warms the hot tier
				if a, err := s.Acquire(ctx, req); err != nil || a.Outcome != store.Replayed {
					t.Fatalf("duplicate %d: %v, %v; want the replay", i, a.Outcome, err)
				}
				c, _ := cold.Get(ctx, "PAY-12")
				h, err := hot.Get(ctx, "PAY-12")
				if hold == 0 && err != nil {
					t.Fatalf("the hot tier was not re-warmed: %v", err)
				}
				if err == nil && h.ExpiresAt.After(c.ExpiresAt) {
					t.Fatalf("the hot copy (%v) expires %v after the cold record", h.State, h.ExpiresAt.Sub(c.ExpiresAt))
				}
			}
		})
	}
}

// heldSettles is a hot tier whose Complete is held for a while before the
// store applies it (a stalled connection): the store counts the retention
// from when it applies it.
type heldSettles struct {
	*memstore.Store
	hold time.Duration
}

func (h heldSettles) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	time.Sleep(h.hold) // the write in a stalled connection
	return h.Store.Complete(ctx, key, fence, result, retention)
}

// failedRewarm is a hot tier whose Complete fails (the hot tier out of
// reach for that one write): a duplicate that found the result in the cold
// tier cannot re-warm the hot one and gives its momentary claim back.
type failedRewarm struct{ *memstore.Store }

func (failedRewarm) Complete(context.Context, string, uint64, []byte, time.Duration) error {
	return fmt.Errorf("%w: the hot tier did not answer", store.ErrUnavailable)
}

// TestRefusedSettleBesideAGivenBackClaim: the owner's hot settle is held
// past its lease extension after its archive landed; meanwhile a duplicate
// takes the lapsed claim over, finds the archive in the cold tier and is
// replayed it, but its re-warm of the hot tier fails and it gives its
// momentary claim back (released). The owner's hot settle is then refused.
// Found by the campaign in CI (seed 5306977442868377076, a hot-tier stall):
// the owner withdrew its archive (ErrSettleUncertain), and the key — whose
// work had run and whose result a duplicate had been replayed — was run
// again by the next request. A released (or poisoned) hot record holds no
// owner, and every claim of the hot tier is checked against the cold tier
// first: the archive is the record, and the settle took effect.
func TestRefusedSettleBesideAGivenBackClaim(t *testing.T) {
	clock, hot, s, dup, a := ownerAndDuplicate(t, "PAY-28", func(hot *memstore.Store) store.Store { return failedRewarm{hot} })
	ctx := context.Background()
	req := ownerAndDuplicateRequest("PAY-28")
	var replayed store.Acquisition
	tieredstore.SetAfterArchive(s, func() {
		clock.Advance(2 * req.Lease) // the hot settle held past the lease extension
		var err error
		if replayed, err = dup.Acquire(ctx, req); err != nil {
			t.Error(err)
		}
	})
	settleErr := s.Complete(ctx, req.Key, a.Fence, []byte("booked"), time.Hour)
	if replayed.Outcome != store.Replayed || string(replayed.Record.Result) != "booked" {
		t.Fatalf("the duplicate during the held settle: %v %q; want the archived result replayed", replayed.Outcome, replayed.Record.Result)
	}
	if rec, err := hot.Get(ctx, req.Key); err != nil || rec.State != store.StateReleased {
		t.Fatalf("the hot tier after the failed re-warm: %v, %v; want the momentary claim given back", rec.State, err)
	}
	if settleErr != nil {
		t.Fatalf("the owner's settle: %v; want it in effect (its result was replayed, no other owner ran)", settleErr)
	}
	if r, err := s.Acquire(ctx, req); err != nil || r.Outcome != store.Replayed || string(r.Record.Result) != "booked" {
		t.Fatalf("the next request: %v %q, %v; want the replay, not a second run", r.Outcome, r.Record.Result, err)
	}
}

// TestRefusedSettleBesideAMomentaryClaim: as
// TestRefusedSettleBesideAGivenBackClaim, but the owner's held hot settle is
// refused while the duplicate's momentary claim is still in flight — it has
// read the archive and not yet re-warmed the hot tier with it. The owner
// withdrew its archive (ErrSettleUncertain) though the duplicate was
// replayed it, and the duplicate's re-warm then held the result in the hot
// tier over the cold tombstone: once the hot copy went, the key ran again.
// A refused settle now waits for another claim in flight beside its archive
// to resolve (a momentary claim re-warms or gives back within its lease; an
// owner's heartbeat extends it), and decides on what it became.
func TestRefusedSettleBesideAMomentaryClaim(t *testing.T) {
	clock, _, s, dup, a := ownerAndDuplicate(t, "PAY-29", func(hot *memstore.Store) store.Store { return hot })
	ctx := context.Background()
	req := ownerAndDuplicateRequest("PAY-29")
	atRewarm, rewarm := make(chan struct{}), make(chan struct{})
	tieredstore.SetAfterColdSettled(dup, func() {
		close(atRewarm)
		<-rewarm
	})
	tieredstore.SetAwaitingClaim(s, func() { close(rewarm) })
	dupDone := make(chan store.Acquisition, 1)
	tieredstore.SetAfterArchive(s, func() {
		clock.Advance(2 * req.Lease) // the hot settle held past the lease extension
		go func() {
			d, err := dup.Acquire(ctx, req)
			if err != nil {
				t.Error(err)
			}
			dupDone <- d
		}()
		<-atRewarm // the duplicate read the archive; its claim is in flight
	})
	settleErr := s.Complete(ctx, req.Key, a.Fence, []byte("booked"), time.Hour)
	d := <-dupDone
	if d.Outcome != store.Replayed || string(d.Record.Result) != "booked" {
		t.Fatalf("the duplicate during the held settle: %v %q; want the archived result replayed", d.Outcome, d.Record.Result)
	}
	if settleErr != nil {
		t.Fatalf("the owner's settle: %v; want it in effect (its result was replayed, no other owner ran)", settleErr)
	}
	clock.Advance(2 * time.Minute) // the hot copy goes (HotRetention)
	if r, err := s.Acquire(ctx, req); err != nil || r.Outcome != store.Replayed || string(r.Record.Result) != "booked" {
		t.Fatalf("a request after the hot copy went: %v %q, %v; want the replay, not a second run", r.Outcome, r.Record.Result, err)
	}
}

// twoOverManualTiers returns two tiered stores over one pair of memory tiers
// (the hot one on a manual clock; SettleTimeout 2s, HotRetention 1m): the
// first on the hot tier itself, the second on second(hot).
func twoOverManualTiers(t *testing.T, second func(*memstore.Store) store.Store) (*storetest.ManualClock, *memstore.Store, *tieredstore.Store, *tieredstore.Store) {
	t.Helper()
	clock := storetest.NewManualClock(time.Now())
	hot := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	cold := memstore.New(memstore.Config{SweepInterval: -1})
	var stores [2]*tieredstore.Store
	for i, h := range []store.Store{hot, second(hot)} {
		s, err := tieredstore.New(tieredstore.Config{Hot: h, Cold: cold, SettleTimeout: 2 * time.Second, HotRetention: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	return clock, hot, stores[0], stores[1]
}

// ownerAndDuplicate is twoOverManualTiers with the first store's claim of
// key taken (a): the owner's store and a duplicate's.
func ownerAndDuplicate(t *testing.T, key string, dupHot func(*memstore.Store) store.Store) (*storetest.ManualClock, *memstore.Store, *tieredstore.Store, *tieredstore.Store, store.Acquisition) {
	t.Helper()
	clock, hot, owner, dup := twoOverManualTiers(t, dupHot)
	a, err := owner.Acquire(context.Background(), ownerAndDuplicateRequest(key))
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	return clock, hot, owner, dup, a
}

func ownerAndDuplicateRequest(key string) store.AcquireRequest {
	return store.AcquireRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
}

// TestPoisonedDuringAColdOutage: a Poisoned answer from the hot tier is
// checked against the cold tier (TestPoisonOfACompletedKeyReplays), so while
// the cold tier cannot say, the acquisition fails closed — retried later,
// not dead-lettered — and once it answers (nothing settled there) the key
// is told Poisoned.
func TestPoisonedDuringAColdOutage(t *testing.T) {
	ctx := context.Background()
	s, hot, _, proxy := proxiedTiers(t, time.Hour)
	req := store.AcquireRequest{Key: "PAY-30", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	a, err := hot.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	if err := hot.Release(ctx, req.Key, a.Fence); err != nil {
		t.Fatal(err)
	}
	req.MaxAttempts = 1
	proxy.Cut()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	p, err := s.Acquire(cctx, req)
	cancel()
	if err == nil {
		t.Fatalf("an acquisition during the cold outage: %v; want an error (the cold tier cannot say)", p.Outcome)
	}
	proxy.Restore()
	for {
		p, err = s.Acquire(ctx, req)
		if errors.Is(err, store.ErrUnavailable) {
			time.Sleep(50 * time.Millisecond) // the pool reconnects
			continue
		}
		break
	}
	if err != nil || p.Outcome != store.Poisoned {
		t.Fatalf("after the outage: %v, %v; want Poisoned", p.Outcome, err)
	}
}

// TestGuardSettlesAcrossAColdOutageLongerThanItsLease: work that ends while
// the cold tier is out of reach keeps its claim for as long as the hot tier
// takes the Guard's heartbeats, and is settled once the cold tier is back.
// Given up at the end of the lease it had when the work ended, the settle
// would leave the key in flight, to be run a second time by the next
// delivery after a cold outage longer than a lease (a failover of the
// PostgreSQL behind it, say) — or under a cold tier merely slower than its
// archive budget for that long.
func TestGuardSettlesAcrossAColdOutageLongerThanItsLease(t *testing.T) {
	s, proxy := proxiedColdTiers(t, time.Hour)
	o := startOutageRun(t, s, proxy, context.Background())
	select {
	case <-o.pastTheLease:
	case err := <-o.done:
		t.Fatalf("Run returned during the cold outage, within the lease it had when its work ended (%v): the key is left in flight, to be run again", err)
	}
	proxy.Restore()
	if err := <-o.done; err != nil {
		t.Fatalf("the settle after the cold outage: %v", err)
	}
	res, err := o.g.Run(context.Background(), o.key, nil, func(context.Context, uint64) ([]byte, error) {
		o.runs.Add(1)
		return []byte("booked twice"), nil
	})
	if err != nil || res.Outcome != store.Replayed || string(res.Value) != "booked" {
		t.Fatalf("a duplicate after the settle: %v %q %v, want Replayed %q", res.Outcome, res.Value, err, "booked")
	}
	if n := o.runs.Load(); n != 1 {
		t.Fatalf("the work ran %d times", n)
	}
}

// TestGuardSettleEndsWithTheCallerOrTheLease: the settle outlives its lease
// only while the caller waits and the store takes the heartbeats. A caller
// that gives up during a cold outage is answered once the lease runs out;
// with the whole store out of reach (no heartbeat lands), the settle ends
// with the lease.
func TestGuardSettleEndsWithTheCallerOrTheLease(t *testing.T) {
	t.Run("caller gives up", func(t *testing.T) {
		s, proxy := proxiedColdTiers(t, time.Hour)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		o := startOutageRun(t, s, proxy, ctx)
		select {
		case <-o.pastTheLease:
		case err := <-o.done:
			t.Fatalf("Run returned during the cold outage, within the lease it had when its work ended: %v", err)
		}
		cancel()
		o.settleGivenUp(t)
	})
	t.Run("store out of reach", func(t *testing.T) {
		conn, proxy := testenv.PostgresProxy(t)
		s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{ConnString: conn})
		o := startOutageRun(t, s, proxy, context.Background())
		o.settleGivenUp(t)
		if o.beats.Load() == 0 {
			t.Fatal("no heartbeat was tried between the settle's tries")
		}
	})
}

// outageRun is a Guard's run whose work cuts the store's proxy as it ends
// (the cold tier's, or the whole store's).
type outageRun struct {
	g            *idem.Guard
	key          idem.Key
	runs         atomic.Int32
	beats        atomic.Int32  // the heartbeats tried after the work ended
	pastTheLease chan struct{} // closed at a settle tried and refused twice the lease after the work ended
	done         chan error    // Run's error
}

const outageLease = 600 * time.Millisecond

func startOutageRun(t *testing.T, s store.Store, proxy *testenv.Proxy, ctx context.Context) *outageRun {
	t.Helper()
	o := &outageRun{key: idem.Key{Scope: "payments", ID: testenv.RandomName("p")}, pastTheLease: make(chan struct{}), done: make(chan error, 1)}
	var workEnded atomic.Int64 // unix ns
	var once sync.Once
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: outageLease, HeartbeatInterval: outageLease / 4, Observer: func(e idem.Event) {
		end := workEnded.Load()
		if end == 0 {
			return
		}
		if e.Phase == "heartbeat" {
			o.beats.Add(1)
		}
		if e.Phase == "settle" && e.Err != nil && time.Since(time.Unix(0, end)) > 2*outageLease {
			once.Do(func() { close(o.pastTheLease) })
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	o.g = g
	go func() {
		_, err := g.Run(ctx, o.key, nil, func(context.Context, uint64) ([]byte, error) {
			o.runs.Add(1)
			proxy.Cut()
			workEnded.Store(time.Now().UnixNano())
			return []byte("booked"), nil
		})
		o.done <- err
	}()
	return o
}

// settleGivenUp waits for Run to answer that the settle did not land.
func (o *outageRun) settleGivenUp(t *testing.T) {
	t.Helper()
	select {
	case err := <-o.done:
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Run: %v, want the settle given up (ErrStoreUnavailable)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still settling 30 s after its work ended")
	}
}

// TestArchiveCommittedAfterItsDeadline: an owner's archive that reached the
// cold tier before its deadline but was applied after it — it waited for the
// key's row, held by another transaction (a commit slow to reach the disk,
// or a database short of CPU, does the same), and the network then stalled,
// so that neither its answer nor its cancellation got through: its caller
// was told it failed — must not become the key's result beside a claim
// taken once the owner's lease ended, nor after the key was answered
// Poisoned (the owner's claim counted as the last attempt). A claim's cold
// read, and a poisoning's, waits for the archives of its key under way: it
// sees the archive (a replay) or fails closed, never hands the key out or
// dead-letters it and lets the archive land after.
func TestArchiveCommittedAfterItsDeadline(t *testing.T) {
	t.Run("takeover", func(t *testing.T) { testArchiveCommittedAfterItsDeadline(t, 0) })
	t.Run("poisoning", func(t *testing.T) { testArchiveCommittedAfterItsDeadline(t, 1) })
}

func testArchiveCommittedAfterItsDeadline(t *testing.T, maxAttempts int) {
	clock := storetest.NewManualClock(time.Now())
	hot := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	schema := testenv.RandomName("idemtest_")
	conn, proxy := testenv.PostgresProxy(t)
	const app = "idem-late-commit-test"
	// The owner reaches the cold tier through the proxy; the redelivery,
	// on the other side of the stall, directly.
	// The archive gets half the SettleTimeout: the network must stall
	// before that, or pgx's cancellation reaches the database.
	const settleTimeout = 4 * time.Second
	owner, err := tieredstore.New(tieredstore.Config{Hot: hot, SettleTimeout: settleTimeout,
		Cold: testenv.OpenPostgres(t, schema, pgstore.Config{ConnString: conn + "&application_name=" + app})})
	if err != nil {
		t.Fatal(err)
	}
	cold := testenv.OpenPostgres(t, schema, pgstore.Config{})
	other, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Unstall(); owner.Close(); other.Close() })
	ctx := context.Background()
	req := store.AcquireRequest{Key: "payments/" + testenv.RandomName("p"), Fingerprint: "A", Lease: time.Second, Retention: time.Hour}
	a, err := owner.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatalf("acquire: %v %v", a.Outcome, err)
	}

	// Another transaction holds the key's row: the archive, in time, waits
	// for it; then the network stalls.
	tx, err := cold.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "idem_records"}.Sanitize()+`
		(k, state, fence, attempts, lease_until, expires_at, updated_at, outcome) VALUES ($1, 5, 0, 0, now(), now(), now(), 0)`, keypack.AppendKey(nil, req.Key)); err != nil {
		t.Fatal(err)
	}
	settled := make(chan error, 1)
	start := time.Now()
	go func() { settled <- owner.Complete(ctx, req.Key, a.Fence, []byte("booked"), time.Hour) }()
	testenv.Eventually(t, 10*time.Second, "the archive waiting for the row", func() error {
		var n int
		if err := cold.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n); err != nil || n == 0 {
			return fmt.Errorf("%d sessions waiting (%v)", n, err)
		}
		return nil
	})
	proxy.Stall()
	if took := time.Since(start); took >= settleTimeout/2 {
		t.Fatalf("the archive was seen waiting %v after it began, past its deadline: its cancellation may have reached the database before the stall", took)
	}
	if err := <-settled; err == nil {
		t.Fatal("the owner's settle succeeded while its archive waited past its deadline")
	}
	clock.Advance(time.Minute) // the owner's lease ends

	// A redelivery: its claim's (or poisoning's) cold read meets the archive
	// under way.
	req.MaxAttempts = maxAttempts
	b, err := other.Acquire(ctx, req)
	if err == nil && b.Outcome.Owns() {
		t.Fatalf("a claim (%v) was handed out while the owner's archive was under way: it lands beside the claim, and duplicates are replayed a result the claim's work then replaces", b.Outcome)
	}
	if err == nil && b.Outcome == store.Poisoned {
		t.Fatal("the key was answered Poisoned while the owner's archive was under way: it lands after, and the key dead-lettered is replayed")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The archive lands now; the next redelivery is its replay.
	testenv.Eventually(t, 10*time.Second, "the replay of the archive", func() error {
		c, err := other.Acquire(ctx, req)
		if err != nil {
			return err
		}
		if c.Outcome != store.Replayed || string(c.Record.Result) != "booked" {
			t.Fatalf("after the archive landed: %v %q, want Replayed %q", c.Outcome, c.Record.Result, "booked")
		}
		return nil
	})
}

// lostFirstComplete is a memory hot tier whose first Complete is applied
// but answered as if the connection broke before the answer.
type lostFirstComplete struct {
	*memstore.Store
	lost atomic.Bool
}

func (s *lostFirstComplete) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	err := s.Store.Complete(ctx, key, fence, result, retention)
	if err == nil && s.lost.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: the answer was lost", store.ErrUnavailable)
	}
	return err
}

// TestGuardSettleThatLandedBeforeARewarm: a Guard's completion lands in both
// tiers but its answer is lost; before the Guard tries again, the hot copy
// expires (the hot retention) and a duplicate re-warms it from the archive,
// under the duplicate's momentary claim. The retry finds the hot record
// settled under another fence — yet the settle is its own: Run must say it
// landed, not that the claim was lost.
func TestGuardSettleThatLandedBeforeARewarm(t *testing.T) {
	clock := storetest.NewManualClock(time.Now())
	hot := &lostFirstComplete{Store: memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})}
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: memstore.New(memstore.Config{SweepInterval: -1}), HotRetention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := idem.Key{Scope: "payments", ID: "p1"}
	var g *idem.Guard
	var rewarmed store.Acquisition
	var once sync.Once
	g, err = idem.NewGuard(idem.Config{Store: s, Lease: time.Minute, Retention: time.Hour, Observer: func(e idem.Event) {
		if e.Phase == "settle" && e.Err != nil {
			once.Do(func() { // between the first try and the next
				clock.Advance(2 * time.Second) // the hot copy expires
				rewarmed, err = s.Acquire(ctx, store.AcquireRequest{Key: g.StorageKey(key), Lease: time.Minute, Retention: time.Hour})
			})
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	_, runErr := g.Run(ctx, key, nil, func(context.Context, uint64) ([]byte, error) { return []byte("booked"), nil })
	if err != nil || rewarmed.Outcome != store.Replayed {
		t.Fatalf("the duplicate between the tries: %v %v, want Replayed", rewarmed.Outcome, err)
	}
	if runErr != nil {
		t.Fatalf("Run: %v — its completion landed (a duplicate was replayed it)", runErr)
	}
}

// heldHeartbeatReply is a memory hot tier whose armed Heartbeat is applied
// at once and answered only when the test lets it (a reply held up on its
// way back: a stalled network, a paused process).
type heldHeartbeatReply struct {
	*memstore.Store
	armed            atomic.Bool
	applied, release chan struct{}
}

func (s *heldHeartbeatReply) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	err := s.Store.Heartbeat(ctx, key, fence, lease)
	if s.armed.CompareAndSwap(true, false) {
		close(s.applied)
		<-s.release
	}
	return err
}

// TestArchiveBudgetCountsFromBeforeTheHeartbeat: a settle extends its hot
// lease by SettleTimeout and gives the archive half of it — counted from
// before the heartbeat was sent, for the lease runs from when the hot tier
// applied it. Counted from when its answer came back, an answer held up
// longer than half the extension let the archive land after the lease had
// ended, beside a takeover's claim (tiered TestCampaignBuckets, seed
// 16699538669798421197: the owner's result replayed, then the taker's).
func TestArchiveBudgetCountsFromBeforeTheHeartbeat(t *testing.T) {
	const settle = 100 * time.Millisecond
	hot := &heldHeartbeatReply{Store: memstore.New(memstore.Config{SweepInterval: -1}), applied: make(chan struct{}), release: make(chan struct{})}
	cold := memstore.New(memstore.Config{SweepInterval: -1})
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, SettleTimeout: settle})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "A", Lease: settle, Retention: time.Hour})
	if err != nil || first.Outcome != store.Acquired {
		t.Fatalf("first acquire: %+v, %v", first, err)
	}
	hot.armed.Store(true)
	settled := make(chan error, 1)
	go func() { settled <- s.Complete(ctx, "k", first.Fence, []byte("first"), time.Hour) }()
	<-hot.applied
	// The owner's extended lease ends; another caller takes the key over.
	var taken store.Acquisition
	testenv.Eventually(t, 10*time.Second, "a takeover once the extended lease ended", func() error {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "A", Lease: time.Minute, Retention: time.Hour})
		if err == nil && a.Outcome != store.TakenOver {
			err = fmt.Errorf("acquire answered %v", a.Outcome)
		}
		taken = a
		return err
	})
	close(hot.release)
	if err := <-settled; err == nil || errors.Is(err, tieredstore.ErrSettleUncertain) {
		t.Fatalf("the owner's Complete, its heartbeat's answer held up past its archive's budget: %v — its archive landed after its lease, beside the takeover's claim", err)
	}
	if rec, err := cold.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the cold tier holds %+v, %v; want nothing: the owner's archive came too late", rec, err)
	}
	dup, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "A", Lease: time.Minute, Retention: time.Hour})
	if err != nil || dup.Outcome != store.InProgress || dup.Record.Fence != taken.Fence {
		t.Fatalf("a duplicate after: %v (fence %d), %v; want InProgress under the takeover's fence %d", dup.Outcome, dup.Record.Fence, err, taken.Fence)
	}
}

// hotDropsFail is a memory hot tier whose DeleteUpTo fails (the hot tier cut
// at that moment).
type hotDropsFail struct{ *memstore.Store }

func (hotDropsFail) DeleteUpTo(context.Context, string, uint64) error {
	return fmt.Errorf("%w: connection reset", store.ErrUnavailable)
}

// TestNoPoisoningOfAKeySettledInTheColdTier: a caller claimed a key for a
// moment (to read the cold tier, where the key is completed) and died; its
// hot claim counted an attempt. A duplicate with MaxAttempts 1 must be
// answered the replay and leave no poisoned record behind: a poisoned hot
// copy shadows the key once the cold record expires (every request then
// told Poisoned, dead-lettered, instead of running a key whose retention
// ended), and other callers see it before any drop lands. Found by the
// tiered buckets campaign (seed 17602973348286608137: a duplicate without
// MaxAttempts told Poisoned just after the completion expired).
func TestNoPoisoningOfAKeySettledInTheColdTier(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewManualClock(time.Now())
	hot := hotDropsFail{memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})}
	cold := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
	if err != nil {
		t.Fatal(err)
	}
	done := store.Record{Key: "PAY-26", State: store.StateCompleted, Fence: 1, Fingerprint: "A", Attempts: 1, Result: []byte("done")}
	if err := cold.Archive(ctx, done, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	req := store.AcquireRequest{Key: "PAY-26", Fingerprint: "A", Lease: time.Second, Retention: time.Hour}
	// The dead caller's momentary claim, its lease then over.
	if a, err := hot.Acquire(ctx, req); err != nil || a.Outcome != store.Acquired {
		t.Fatalf("the momentary claim: %v, %v", a.Outcome, err)
	}
	clock.Advance(2 * time.Second)
	once := req
	once.MaxAttempts = 1
	if a, err := s.Acquire(ctx, once); err != nil || a.Outcome != store.Replayed || string(a.Record.Result) != "done" {
		t.Fatalf("a duplicate with MaxAttempts 1: %v %q, %v; want the completion replayed", a.Outcome, a.Record.Result, err)
	}
	if rec, err := hot.Get(ctx, "PAY-26"); err == nil && rec.State == store.StatePoisoned {
		t.Fatalf("the hot tier holds %v (attempts %d) for a key completed in the cold tier", rec.State, rec.Attempts)
	}
	// The completion's retention ends, and so does its re-warmed hot copy
	// (given the time the cold record had left, read on the wall clock).
	clock.Advance(11 * time.Second)
	if a, err := s.Acquire(ctx, req); err != nil || a.Outcome != store.Acquired {
		t.Fatalf("a request after the completion expired: %v, %v; want Acquired", a.Outcome, err)
	}
}

// seenAfterWrites is a memory hot tier that reads the key back after each
// write that ends a claim (Release, Unclaim, PoisonClaim) and keeps the
// states it saw: what any other caller could have seen at that moment.
type seenAfterWrites struct {
	*memstore.Store
	seen []store.State
}

func (s *seenAfterWrites) look(ctx context.Context, key string, err error) error {
	if rec, gerr := s.Store.Get(ctx, key); gerr == nil {
		s.seen = append(s.seen, rec.State)
	}
	return err
}

func (s *seenAfterWrites) Release(ctx context.Context, key string, fence uint64) error {
	return s.look(ctx, key, s.Store.Release(ctx, key, fence))
}

func (s *seenAfterWrites) Unclaim(ctx context.Context, key string, fence uint64) error {
	return s.look(ctx, key, s.Store.Unclaim(ctx, key, fence))
}

func (s *seenAfterWrites) PoisonClaim(ctx context.Context, key string, fence uint64) error {
	return s.look(ctx, key, s.Store.PoisonClaim(ctx, key, fence))
}

// TestPoisoningIsOneStep: a request at its MaxAttempts takes the key over
// in the hot tier (asked without MaxAttempts), finds nothing settled in the
// cold tier and poisons the key. No other caller may see the key released
// between the claim and the poisoning — nor claim it then, running the work
// the poisoning dead-letters (the fault campaign's model refuses a Get that
// sees it released).
func TestPoisoningIsOneStep(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewManualClock(time.Now())
	hot := &seenAfterWrites{Store: memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})}
	cold := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
	if err != nil {
		t.Fatal(err)
	}
	req := store.AcquireRequest{Key: "PAY-27", Fingerprint: "A", Lease: time.Second, Retention: time.Hour}
	first, err := s.Acquire(ctx, req)
	if err != nil || first.Outcome != store.Acquired {
		t.Fatalf("the first claim: %v, %v", first.Outcome, err)
	}
	clock.Advance(2 * time.Second) // its owner died
	once := req
	once.MaxAttempts = 1
	a, err := s.Acquire(ctx, once)
	if err != nil || a.Outcome != store.Poisoned || a.Record.State != store.StatePoisoned || a.Record.Attempts != 1 {
		t.Fatalf("the request at MaxAttempts: %v (%+v), %v; want Poisoned with 1 attempt", a.Outcome, a.Record, err)
	}
	if !slices.Equal(hot.seen, []store.State{store.StatePoisoned}) {
		t.Fatalf("the hot tier was seen %v between the claim and the answer; want only poisoned", hot.seen)
	}
	if a, err := s.Acquire(ctx, req); err != nil || a.Outcome != store.Poisoned {
		t.Fatalf("a request without MaxAttempts after: %v, %v; want Poisoned", a.Outcome, err)
	}
}

// TestPoisoningOfAClaimTakenOver: a request at its MaxAttempts takes the key
// over in the hot tier, and is paused past its lease while it reads the
// cold tier; another caller takes the key over meanwhile. The poisoning
// finds the claim gone and the request fails as unavailable; the other
// caller keeps the key.
func TestPoisoningOfAClaimTakenOver(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewManualClock(time.Now())
	hot := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	var other store.Acquisition
	cold := &pausedRead{Store: memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})}
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
	if err != nil {
		t.Fatal(err)
	}
	req := store.AcquireRequest{Key: "PAY-27", Fingerprint: "A", Lease: time.Second, Retention: time.Hour}
	if a, err := s.Acquire(ctx, req); err != nil || a.Outcome != store.Acquired {
		t.Fatalf("the first claim: %v, %v", a.Outcome, err)
	}
	clock.Advance(2 * time.Second) // its owner died
	cold.during = func() {
		clock.Advance(2 * time.Second) // the request's own claim ends
		other, _ = hot.Acquire(ctx, req)
	}
	once := req
	once.MaxAttempts = 1
	if a, err := s.Acquire(ctx, once); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("the request at MaxAttempts: %v, %v; want ErrUnavailable (its claim was taken over)", a.Outcome, err)
	}
	if other.Outcome != store.TakenOver {
		t.Fatalf("the other caller: %v; want TakenOver", other.Outcome)
	}
	if rec, err := hot.Get(ctx, req.Key); err != nil || rec.State != store.StateInFlight || rec.Fence != other.Fence {
		t.Fatalf("the hot record: %+v, %v; want the other caller's claim", rec, err)
	}
}

// pausedRead is a memory cold tier whose next read runs during (once) first.
type pausedRead struct {
	*memstore.Store
	during func()
}

func (s *pausedRead) Get(ctx context.Context, key string) (store.Record, error) {
	if f := s.during; f != nil {
		s.during = nil
		f()
	}
	return s.Store.Get(ctx, key)
}

// failover is a hot tier that fails over between two memory stores: the
// primary, and a replica that lags (it holds an earlier state: Redis's
// asynchronous replication loses acknowledged writes).
type failover struct{ *memstore.Store }

// TestRefusedSettleBesideAnOlderClaim: the hot tier fails over, between an
// owner's archive and its hot settle, to a replica holding an older claim of
// the key (its owner still working). The owner's settle is refused and
// uncertain; the older claim's owner then completes in the hot tier. Found
// by the protocol model (internal/model, tiered.pml with FAILOVER): the
// refused owner withdrew its archive with a tombstone of its fence, which
// also kept the older owner's archive out, so that owner's Complete
// returned nil with nothing in the cold tier, and once the hot copy went
// the key ran a third time. A claim older than the settle's own, in flight
// in the hot tier, is no takeover made after it (the hot tier went back):
// the archive stands.
func TestRefusedSettleBesideAnOlderClaim(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewManualClock(time.Now())
	primary := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	replica := memstore.New(memstore.Config{SweepInterval: -1, Clock: clock})
	cold := memstore.New(memstore.Config{SweepInterval: -1})
	hot := &failover{replica}
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, SettleTimeout: 500 * time.Millisecond, HotRetention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	req := store.AcquireRequest{Key: "PAY-30", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	older, err := s.Acquire(ctx, req) // as the replica holds it
	if err != nil || older.Outcome != store.Acquired {
		t.Fatalf("the older claim: %v, %v", older.Outcome, err)
	}
	clock.Advance(time.Second)
	hot.Store = primary // the primary, which holds a later claim instead
	later, err := s.Acquire(ctx, req)
	if err != nil || later.Outcome != store.Acquired || later.Fence <= older.Fence {
		t.Fatalf("the later claim: %v (fence %d after %d), %v", later.Outcome, later.Fence, older.Fence, err)
	}
	tieredstore.SetAfterArchive(s, func() { hot.Store = replica }) // the failover
	if err := s.Complete(ctx, req.Key, later.Fence, []byte("later"), time.Hour); !errors.Is(err, tieredstore.ErrSettleUncertain) {
		t.Fatalf("the later owner's settle on the replica: %v; want ErrSettleUncertain", err)
	}
	tieredstore.SetAfterArchive(s, nil)
	if err := s.Complete(ctx, req.Key, older.Fence, []byte("older"), time.Hour); err != nil {
		t.Fatalf("the older owner's settle: %v", err)
	}
	if rec, err := cold.Get(ctx, req.Key); err != nil || rec.State != store.StateCompleted {
		t.Fatalf("the cold tier after both settles: %v, %v; want the key settled there", rec.State, err)
	}
	if err := replica.Delete(ctx, req.Key); err != nil { // the hot copy goes
		t.Fatal(err)
	}
	if a, err := s.Acquire(ctx, req); err != nil || a.Outcome != store.Replayed {
		t.Fatalf("a request once the hot copy went: %v, %v; want a replay, not a third run", a.Outcome, err)
	}
}
