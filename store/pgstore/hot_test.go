package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/pgstore"
)

// TestSettleUpdatesTheRowInPlace: a settle a moment after its acquire
// leaves the row's indexed columns as they were, so PostgreSQL updates it in
// place (a heap-only tuple: no second index entry, and the old version is
// pruned from its page without VACUUM). Most settles must be HOT updates,
// alone and coalesced.
func TestSettleUpdatesTheRowInPlace(t *testing.T) {
	ctx := context.Background()
	s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{ConnString: testenv.PostgresURL + "&pool_max_conns=1"})
	const n = 400
	// One pooled connection: the 16 workers' settles share statements.
	testenv.CompleteMany(t, s, n, func(i int) string { return fmt.Sprintf("hot-%d", i) })
	// The table's statistics reach the shared counters when the backend that
	// wrote them flushes them: ask it to, then read (on the one connection).
	var upd, hot int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := s.Pool().Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		if err := s.Pool().QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`, s.Table()).Scan(&upd, &hot); err != nil {
			t.Fatal(err)
		}
		if upd >= n || time.Now().After(deadline) {
			break
		}
	}
	if upd < n {
		t.Fatalf("the statistics count %d updates of %d settles", upd, n)
	}
	t.Logf("%d of %d updates in place (HOT)", hot, upd)
	if hot < upd*8/10 {
		t.Errorf("%d of %d settles were HOT updates, want most", hot, upd)
	}
}

// TestExpiryRoundedUpToASecond: with a retention of a minute or more, a
// record expires at the whole second at or after the retention asked (never
// earlier, at most a second later); a shorter retention is kept exactly as
// asked (the server's clock, to the millisecond).
func TestExpiryRoundedUpToASecond(t *testing.T) {
	ctx := context.Background()
	s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
	serverNow := func() time.Time {
		var now time.Time
		if err := s.Pool().QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	check := func(what string, got, before, after time.Time, retention time.Duration) {
		t.Helper()
		lo, hi := before.Add(retention), after.Add(retention)
		if retention >= time.Minute {
			hi = hi.Add(time.Second)
			if got.Nanosecond() != 0 {
				t.Errorf("%s: expiry %v is not a whole second", what, got)
			}
		}
		if got.Before(lo.Truncate(time.Millisecond)) || got.After(hi) {
			t.Errorf("%s: expiry %v, want within [%v, %v]", what, got, lo, hi)
		}
	}
	for _, ret := range []time.Duration{time.Hour, 90 * time.Second, 30 * time.Second} {
		key := fmt.Sprintf("k-%v", ret)
		before := serverNow()
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Lease: 10 * time.Second, Retention: ret})
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("%v, acquired", ret), a.Record.ExpiresAt, before, serverNow(), ret)
		before = serverNow()
		if err := s.Fail(ctx, key, a.Fence, []byte("no"), ret/2); err != nil {
			t.Fatal(err)
		}
		after := serverNow()
		rec, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("%v, failed with half of it", ret), rec.ExpiresAt, before, after, ret/2)
	}
}
