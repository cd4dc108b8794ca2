package pgstore_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/pgstore"
)

// TestFenceGrowsAfterAnAcquireWaitedOnDeletes: an acquisition of a key whose
// row another transaction is deleting waits for it; meanwhile, once that
// delete committed, another caller claims the key afresh (fence F) and a
// second Delete removes that claim. The waiting acquisition, when it goes on,
// must not take the key with a fence below F: fences grow for as long as the
// key lives, across deletes (a holder fenced out by F's claim would be let
// back in). The fault campaign found it (seed 11601895855146673435: "fail
// with fence … accepted after fence … was issued", two Deletes of one key at
// once on a loaded machine); here the waiting session is held with SIGSTOP
// (its backend process; needs the right to signal PostgreSQL's processes)
// while the others go on.
func TestFenceGrowsAfterAnAcquireWaitedOnDeletes(t *testing.T) {
	const waiterApp, otherApp = "idem-fence-waiter-test", "idem-fence-other-test"
	schema := testenv.RandomName("idemtest_")
	waiter := testenv.OpenPostgres(t, schema, pgstore.Config{ConnString: testenv.PostgresURL + "&application_name=" + waiterApp + "&pool_max_conns=1"})
	other := testenv.OpenPostgres(t, schema, pgstore.Config{ConnString: testenv.PostgresURL + "&application_name=" + otherApp})
	watch := testenv.OpenPostgres(t, schema, pgstore.Config{})
	ctx := context.Background()
	req := store.AcquireRequest{Key: "k", Fingerprint: "A", Lease: time.Minute, Retention: time.Hour}
	first, err := other.Acquire(ctx, req)
	if err != nil || first.Outcome != store.Acquired {
		t.Fatalf("first acquire: %+v, %v", first, err)
	}
	// A session of app waiting for a lock: its backend's process id.
	waitingPid := func(app string) (int, error) {
		var pid int
		err := watch.Pool().QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1
			AND wait_event_type = 'Lock' AND state = 'active'`, app).Scan(&pid)
		return pid, err
	}

	// The first Delete, its transaction held open.
	d1, err := other.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d1.Rollback(ctx)
	if _, err := d1.Exec(ctx, other.DeleteStatement(), other.KeyArg("k")); err != nil {
		t.Fatal(err)
	}
	acquired := make(chan acquisition, 1)
	go func() {
		a, err := waiter.Acquire(ctx, req)
		acquired <- acquisition{a, err}
	}()
	var pid int
	testenv.Eventually(t, 10*time.Second, "the acquisition waiting for the delete", func() (err error) {
		pid, err = waitingPid(waiterApp)
		return err
	})
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		if testenv.Required() {
			t.Fatalf("cannot hold PostgreSQL's backend %d (SIGSTOP: run as root or as PostgreSQL's user) and IDEM_TEST_REQUIRE=1: %v", pid, err)
		}
		t.Skipf("cannot hold PostgreSQL's backend %d (SIGSTOP: run as root or as PostgreSQL's user): %v", pid, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT backend %d: %v", pid, err)
			}
		}
	}
	t.Cleanup(resume)

	if err := d1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := other.Acquire(ctx, req)
	if err != nil || second.Outcome != store.Acquired {
		t.Fatalf("the claim after the first delete: %+v, %v", second, err)
	}
	// The second Delete: it either removes that claim at once, or waits
	// for the held acquisition (which then finds the claim).
	deleted := make(chan error, 1)
	go func() { deleted <- other.Delete(ctx, "k") }()
	testenv.Eventually(t, 10*time.Second, "the second delete done or waiting", func() error {
		select {
		case err := <-deleted:
			deleted <- err
			return nil
		default:
		}
		_, err := waitingPid(otherApp)
		return err
	})
	resume()

	got := <-acquired
	if got.err != nil {
		t.Fatalf("the held acquisition: %v", got.err)
	}
	if got.a.Outcome == store.Acquired && got.a.Fence <= second.Fence {
		t.Fatalf("the held acquisition took the key with fence %d, after fence %d was handed out (fences went back)", got.a.Fence, second.Fence)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("the second delete: %v", err)
	}
	// And after everything, a claim's fence is above every fence handed out.
	last, err := other.Acquire(ctx, req)
	if err != nil || last.Outcome != store.Acquired || last.Fence <= max(second.Fence, got.a.Fence) {
		t.Fatalf("the last claim: %+v, %v; want a fence above %d and %d", last, err, second.Fence, got.a.Fence)
	}
}

type acquisition struct {
	a   store.Acquisition
	err error
}

// TestSweepOfManyExpiredRecords: one Sweep call of a large limit deletes
// them all. A sweep takes each key's advisory lock (see
// TestFenceGrowsAfterAnAcquireWaitedOnDeletes); taken all in one
// transaction, 20,000 of them overflowed PostgreSQL's lock table at the
// default max_locks_per_transaction ("out of shared memory"), so the sweep
// goes in transactions of a bounded size.
func TestSweepOfManyExpiredRecords(t *testing.T) {
	s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
	ctx := context.Background()
	const n = 20000
	if _, err := s.Pool().Exec(ctx, `INSERT INTO `+s.Table()+` (k, state, fence, attempts, lease_until, expires_at, updated_at, outcome)
		SELECT convert_to('old-' || i, 'UTF8'), 2, i, 1, now() - interval '2 hours', now() - interval '1 hour', now(), 1 FROM generate_series(1, $1) i`, n); err != nil {
		t.Fatal(err)
	}
	swept, err := s.Sweep(ctx, n)
	if err != nil || swept != n {
		t.Fatalf("Sweep(%d) of %d expired records: %d, %v", n, n, swept, err)
	}
}
