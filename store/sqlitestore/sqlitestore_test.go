package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"modernc.org/sqlite"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/sqlitestore"
	"github.com/idemgo/idem/store/storetest"
)

func openAt(t testing.TB, path string) store.Store {
	s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newStore(t testing.TB) store.Store {
	return openAt(t, filepath.Join(t.TempDir(), "idem.db"))
}

// TestConformance runs the suite on the store's injected clock: the lease
// and retention cases advance it instead of sleeping.
func TestConformance(t *testing.T) {
	storetest.RunClocked(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, Persistent: true, ListsRecords: true, Archives: true}, func(t testing.TB, clock idem.Clock) store.Store {
		s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "idem.db"), Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func TestMultiProcess(t *testing.T) {
	storetest.MultiProcess(t, "TestMultiProcess", filepath.Join(t.TempDir(), "shared.db"), 4, 200, openAt)
}

func TestCrashTakeover(t *testing.T) {
	storetest.CrashTakeover(t, "TestCrashTakeover", filepath.Join(t.TempDir(), "crash.db"), openAt)
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, newStore)
}

func TestCampaign(t *testing.T) { storetest.Campaign(t, campaignConfig(t, "TestCampaign")) }

// TestGuardCampaign runs guarded work (idem.Guard) under the same faults
// (kills of the processes sharing the file; there is no server to cut).
func TestGuardCampaign(t *testing.T) {
	storetest.GuardCampaign(t, campaignConfig(t, "TestGuardCampaign"))
}

func campaignConfig(t *testing.T, name string) storetest.CampaignConfig {
	loc := filepath.Join(t.TempDir(), "campaign.db")
	if storetest.IsChild() {
		loc = "" // the parent's location comes from the environment
	}
	return storetest.CampaignConfig{TestName: name, Location: loc, Open: openAt, Processes: 2}
}

// TestErrorsKeepTheirCause: a missing table is not "unavailable", the
// driver's error stays reachable, and a closed store says ErrClosed.
func TestErrorsKeepTheirCause(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "e.db")).(*sqlitestore.Store)
	if _, err := s.DB().Exec(`DROP TABLE idem_records`); err != nil {
		t.Fatal(err)
	}
	_, err := s.Acquire(context.Background(), store.AcquireRequest{Key: "k", Lease: time.Second, Retention: time.Hour})
	var se *sqlite.Error
	if !errors.As(err, &se) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v: want the driver's *sqlite.Error, not ErrStoreUnavailable", err)
	}
	s.Close()
	if _, err := s.Get(context.Background(), "k"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// TestFenceFloorAtExecution: a statement may run long after its call (it
// waits for another process's write lock), and meanwhile another process
// may issue a fence; after a Delete, the next generation's fence must still
// exceed it. Found by the fault campaign in CI (seed 18063639851766149526):
// the floor was taken from the caller's clock at call time, so a claim that
// waited got a smaller fence than one issued while it waited, and that
// stale owner's release was accepted. Simulated here: another process's
// claim (a fence of the clock now), a delete, and a claim whose call-time
// clock reads 10 s earlier.
func TestFenceFloorAtExecution(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	late := storetest.NewManualClock(time.Now().Add(-10 * time.Second))
	s, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path, Clock: late})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	other := store.FenceFloor(time.Now()) // another process's claim, just issued
	now := time.Now().UnixMilli()
	if _, err := db.Exec(`INSERT INTO idem_records (k, state, fence, fp, attempts, lease_until, expires_at, updated_at, outcome)
		VALUES (X'006B', 1, ?, X'006670', 1, ?, ?, ?, 1) -- k and fp, packed
		`, int64(other), now+60_000, now+3_600_000, now); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	if a.Fence <= other {
		t.Fatalf("the next generation's fence %d is not above %d, issued before it", a.Fence, other)
	}
}

// TestFencesAcrossADeleteWithinAMillisecond: SQLite's clock has
// milliseconds, so a claim on an empty key takes the fence floor of the
// next millisecond — the same fence for every such claim within one. A key
// claimed (here by another process: a row with that fence), deleted and
// claimed again within the millisecond was handed the deleted claim's
// fence, and the old owner's Complete was accepted on the new owner's
// claim. The claim after a Delete must be above every fence the key had.
func TestFencesAcrossADeleteWithinAMillisecond(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	s := openAt(t, path)
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	req := store.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	for i := range 50 {
		now := time.Now().UnixMilli()
		other := (now + 1) * 1000 // the floor another process's claim took this millisecond
		if _, err := db.Exec(`INSERT INTO idem_records (k, state, fence, fp, attempts, lease_until, expires_at, updated_at, outcome)
			VALUES (X'006B', 1, ?, X'006670', 1, ?, ?, ?, 1) -- k and fp, packed
		`, other, now+60_000, now+3_600_000, now); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		a, err := s.Acquire(ctx, req)
		if err != nil || a.Outcome != store.Acquired {
			t.Fatal(a.Outcome, err)
		}
		if err := s.Complete(ctx, "k", uint64(other), []byte("the old owner's"), time.Hour); !errors.Is(err, store.ErrStaleFence) {
			t.Fatalf("round %d: the deleted claim's owner (fence %d) completed the new claim (fence %d): %v", i, other, a.Fence, err)
		}
		// A claim of this process, deleted and claimed again at once.
		if err := s.Delete(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		b, err := s.Acquire(ctx, req)
		if err != nil || b.Outcome != store.Acquired {
			t.Fatal(b.Outcome, err)
		}
		if b.Fence <= a.Fence {
			t.Fatalf("round %d: the claim after a Delete has fence %d, the deleted one had %d", i, b.Fence, a.Fence)
		}
		if _, err := db.Exec(`DELETE FROM idem_records`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDeletedSeenByAnEarlierClock: processes sharing a file read their
// clocks before their statements run (a call may wait for another's write
// lock), so a call can run just after another process's Delete with a time
// a little before it. Found by the fault campaign (seed
// 7637795599575150592): a Delete left the record as a row released until
// the Delete's own time, and such a call took it for the released record
// of the deleted generation — an acquisition counted its attempts on
// (poisoning the key at MaxAttempts 1 although it never ran), answered
// another fingerprint Mismatch, and Get returned a deleted record. After a
// Delete the key is new to every call.
func TestDeletedSeenByAnEarlierClock(t *testing.T) {
	ctx := context.Background()
	start := time.Now().Truncate(time.Millisecond)
	for _, c := range []struct {
		name  string
		check func(t *testing.T, s store.Store)
	}{
		{"acquire with MaxAttempts 1", func(t *testing.T, s store.Store) {
			a, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour, MaxAttempts: 1})
			if err != nil || a.Outcome != store.Acquired || a.Record.Attempts != 1 {
				t.Fatalf("acquired %v, attempts %d, %v; want a new generation (Acquired, attempts 1)", a.Outcome, a.Record.Attempts, err)
			}
		}},
		{"acquire with another fingerprint", func(t *testing.T, s store.Store) {
			a, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "other", Lease: time.Minute, Retention: time.Hour})
			if err != nil || a.Outcome != store.Acquired {
				t.Fatalf("acquired %v, %v; want Acquired", a.Outcome, err)
			}
		}},
		{"get", func(t *testing.T, s store.Store) {
			if rec, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("got %+v, %v; want ErrNotFound", rec, err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "idem.db")
			open := func(clock idem.Clock) store.Store {
				s, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path, Clock: clock})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
			deleter, late := open(storetest.NewManualClock(start.Add(10*time.Millisecond))), open(storetest.NewManualClock(start.Add(5*time.Millisecond)))
			a, err := deleter.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if err := deleter.Complete(ctx, "k", a.Fence, []byte("done"), time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := deleter.Delete(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			c.check(t, late)
		})
	}
}

// TestConformanceUncoalesced runs the suite with every call its own
// transaction (Config.NoCoalesce).
func TestConformanceUncoalesced(t *testing.T) {
	storetest.RunClocked(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, Persistent: true, ListsRecords: true, Archives: true}, func(t testing.TB, clock idem.Clock) store.Store {
		s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "idem.db"), Clock: clock, NoCoalesce: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestCoalescedTransactionsCarryManyCalls: 16 goroutines running lifecycles
// share transactions, and every lifecycle ends as it would alone, also on
// synchronous=FULL.
func TestCoalescedTransactionsCarryManyCalls(t *testing.T) {
	for _, sync := range []string{"NORMAL", "FULL"} {
		t.Run(sync, func(t *testing.T) {
			s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "idem.db"), Synchronous: sync})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			testenv.CompleteMany(t, s, 16*50, func(i int) string { return fmt.Sprintf("many-%d", i) })
			trips, calls := s.CoalesceStats()
			t.Logf("%d shared transactions carried %d calls", trips, calls)
			if trips == 0 || calls < 2*trips {
				t.Fatalf("16 goroutines at once shared %d transactions carrying %d calls", trips, calls)
			}
			for i := range 16 * 50 {
				if rec, err := s.Get(context.Background(), fmt.Sprintf("many-%d", i)); err != nil || rec.State != store.StateCompleted {
					t.Fatalf("many-%d: %+v %v", i, rec, err)
				}
			}
		})
	}
}
