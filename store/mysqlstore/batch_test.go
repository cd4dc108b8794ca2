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
