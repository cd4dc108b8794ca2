package mysqlstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/mysqlstore"
)

// TestSharedRoundTripDecidesEachCallAsAlone: calls on several keys in one
// round trip each get their own key's outcome — a replay, a mismatch, a
// claim — as they would alone.
func TestSharedRoundTripDecidesEachCallAsAlone(t *testing.T) {
	s := open(t, testenv.MySQLDatabase(t, ""), mysqlstore.Config{NoCoalesce: true})
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Fingerprint: "A", Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, k, a.Fence, []byte(k+"/A"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	req := func(k, fp string) store.AcquireRequest {
		return store.AcquireRequest{Key: k, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour}
	}
	for round := range 3 {
		out, errs := s.AcquireMany(ctx, []store.AcquireRequest{req("c", "B"), req("a", "A"), req("b", "B"), req("new", "N")})
		want := []store.Outcome{store.Mismatch, store.Replayed, store.Mismatch, store.Acquired}
		if round > 0 {
			want[3] = store.InProgress
		}
		for i := range out {
			if errs[i] != nil || out[i].Outcome != want[i] {
				t.Errorf("round %d call %d: %v %v, want %v", round, i, out[i].Outcome, errs[i], want[i])
			}
		}
		out, errs = s.AcquireMany(ctx, []store.AcquireRequest{req("b", "A"), req("c", "A")})
		for i := range out {
			if errs[i] != nil || out[i].Outcome != store.Replayed {
				t.Errorf("round %d call %d after the mismatches: %v %v, want replayed", round, i, out[i].Outcome, errs[i])
			}
		}
	}
}

// TestSharedRoundTripReadsWhatItsClaimLeft: in a shared round trip, each
// call reads back its key's row as the call's own statement left it, also
// when another transaction committed a change to that row after the round
// trip's first read (a snapshot of REPEATABLE READ would show the row as it
// was before that commit, where the call's statement changed nothing).
func TestSharedRoundTripReadsWhatItsClaimLeft(t *testing.T) {
	s := open(t, testenv.MySQLDatabase(t, ""), mysqlstore.Config{NoCoalesce: true})
	ctx := context.Background()
	req := func(k, fp string) store.AcquireRequest {
		return store.AcquireRequest{Key: k, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour}
	}
	for _, k := range []string{"k1", "k2"} {
		a, err := s.Acquire(ctx, req(k, "A"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, k, a.Fence, []byte(k+"/A"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if a, err := s.Acquire(ctx, req("k2", "B")); err != nil || a.Outcome != store.Mismatch {
		t.Fatalf("another fingerprint: %v %v", a.Outcome, err)
	}
	// Another transaction holds k2's row and will leave it as a replay
	// leaves it (outcome Replayed).
	other, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	if _, err := other.ExecContext(ctx, `UPDATE idem_records SET outcome = 4 WHERE k = ?`, keypack.KeyArg("k2")); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		out  []store.Acquisition
		errs []error
	}
	done := make(chan answer, 1)
	go func() {
		out, errs := s.AcquireMany(ctx, []store.AcquireRequest{req("k1", "A"), req("k2", "A")})
		done <- answer{out, errs}
	}()
	// The round trip's claim of k2 runs (and waits for the lock): its
	// claim and read-back of k1 came before.
	testenv.Eventually(t, 10*time.Second, "the round trip's claim of k2", func() error {
		var n int
		if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM information_schema.processlist
			WHERE command = 'Query' AND info LIKE 'INSERT INTO idem_records%' AND info LIKE '%k2%'`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			select {
			case got := <-done:
				t.Fatalf("the round trip did not wait for k2's lock: %v %v", got.out, got.errs)
			default:
			}
			return errors.New("not yet")
		}
		return nil
	})
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	got := <-done
	for i, k := range []string{"k1", "k2"} {
		if got.errs[i] != nil || got.out[i].Outcome != store.Replayed || string(got.out[i].Record.Result) != k+"/A" {
			t.Errorf("%s: %v %q %v, want its replay", k, got.out[i].Outcome, got.out[i].Record.Result, got.errs[i])
		}
	}
}

// TestSharedRoundTripSettlesEachAsAlone: settles and claims of several keys
// in one round trip — settles under the current fence, under a fence taken
// over, of a released key, of a completed one, of an absent one, and claims
// of two MaxAttempts — each answered as it would be alone.
func TestSharedRoundTripSettlesEachAsAlone(t *testing.T) {
	s := open(t, testenv.MySQLDatabase(t, ""), mysqlstore.Config{NoCoalesce: true})
	ctx := context.Background()
	claim := func(k string) store.Acquisition {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Fingerprint: "A", Lease: time.Minute, Retention: time.Hour})
		if err != nil || !a.Outcome.Owns() {
			t.Fatalf("claim %s: %v %v", k, a.Outcome, err)
		}
		return a
	}
	owned, failed := claim("owned"), claim("failed")
	released := claim("released")
	if err := s.Release(ctx, "released", released.Fence); err != nil {
		t.Fatal(err)
	}
	done := claim("done")
	if err := s.Complete(ctx, "done", done.Fence, []byte("first"), time.Hour); err != nil {
		t.Fatal(err)
	}
	stale := claim("stale")
	errs := s.SettleMany(ctx, []mysqlstore.Settle{
		{Key: "stale", Fence: stale.Fence + 1, State: store.StateCompleted, Result: []byte("not mine")},
		{Key: "owned", Fence: owned.Fence, State: store.StateCompleted, Result: []byte("ok")},
		{Key: "released", Fence: released.Fence, State: store.StateCompleted, Result: []byte("late")},
		{Key: "done", Fence: done.Fence, State: store.StateCompleted, Result: []byte("again")},
		{Key: "absent", Fence: 1, State: store.StateCompleted, Result: []byte("nobody's")},
		{Key: "failed", Fence: failed.Fence, State: store.StateFailed, Result: []byte("no")},
	})
	for i, want := range []error{store.ErrStaleFence, nil, store.ErrStaleFence, store.ErrStaleFence, store.ErrStaleFence, nil} {
		if !errors.Is(errs[i], want) || (want == nil) != (errs[i] == nil) {
			t.Errorf("settle %d: %v, want %v", i, errs[i], want)
		}
	}
	for k, want := range map[string]store.Record{
		"owned": {State: store.StateCompleted, Result: []byte("ok")}, "failed": {State: store.StateFailed, Result: []byte("no")},
		"done": {State: store.StateCompleted, Result: []byte("first")}, "stale": {State: store.StateInFlight},
		"released": {State: store.StateReleased},
	} {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.State != want.State || string(rec.Result) != string(want.Result) {
			t.Errorf("%s: %v %q, %v; want %v %q", k, rec.State, rec.Result, err, want.State, want.Result)
		}
	}
	req := func(k string, maxAttempts int) store.AcquireRequest {
		return store.AcquireRequest{Key: k, Fingerprint: "A", Lease: time.Minute, Retention: time.Hour, MaxAttempts: maxAttempts}
	}
	out, aerrs := s.AcquireMany(ctx, []store.AcquireRequest{req("released", 1), req("owned", 0), req("fresh", 1), req("released-too", 0)})
	for i, want := range []store.Outcome{store.Poisoned, store.Replayed, store.Acquired, store.Acquired} {
		if aerrs[i] != nil || out[i].Outcome != want {
			t.Errorf("claim %d: %v %v, want %v", i, out[i].Outcome, aerrs[i], want)
		}
	}
}
