package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/pgstore"
)

// TestServerCrash kills a PostgreSQL server of the test's own — the
// postmaster and every backend, SIGKILL — right after acknowledged writes
// of each kind, and starts it again on the same files: 2,000 completions
// (made by many goroutines: coalesced statements too), then, each followed
// by a crash of its own (a commit that reaches the disk takes every
// earlier one with it, so each kind must be the last before a crash), 200
// claims one by one, 200 by eight goroutines (coalesced statements), 200
// completions, 200 heartbeats, 200 archives, 200 releases, 200 deletes,
// 200 unclaims and 200 fenced deletes. Nothing acknowledged may be lost: a
// lost completion or archive runs its work again, a lost claim or
// heartbeat lets a second owner run the key beside the first. That holds whatever the server's default synchronous_commit:
// with "off" PostgreSQL acknowledges a commit before its WAL is written
// and loses the last fraction of a second of them to a crash — through
// the store's own pool, a pool of the user's and PgBouncer alike, and
// where the setting is turned off while the store runs. The same Store,
// not reopened, must serve again after each crash.
func TestServerCrash(t *testing.T) {
	ctx := context.Background()
	own := func(t *testing.T, srv *testenv.Postgres) pgstore.Config {
		return pgstore.Config{ConnString: srv.URL}
	}
	usersPool := func(t *testing.T, srv *testenv.Postgres) pgstore.Config {
		pool, err := pgxpool.New(ctx, srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pgstore.Config{Pool: pool}
	}
	bouncer := func(t *testing.T, srv *testenv.Postgres) pgstore.Config {
		return pgstore.Config{ConnString: srv.PgBouncer(t), PgBouncer: true}
	}
	// Another client of the same bouncer leaves a session SET on every
	// server connection (it outlives its transaction in transaction
	// pooling), which the store's statements then run on.
	taintedBouncer := func(t *testing.T, srv *testenv.Postgres) pgstore.Config {
		url := srv.PgBouncer(t)
		leaveSessionsAsync(t, url)
		return pgstore.Config{ConnString: url, PgBouncer: true}
	}
	for _, c := range []struct {
		name, setting string
		// turnedOff: the server's default (on) is turned off while the
		// store runs (ALTER SYSTEM and a reload, after Migrate, on the
		// connections the store already has, as in a service that runs
		// for days).
		turnedOff bool
		config    func(*testing.T, *testenv.Postgres) pgstore.Config
	}{
		{"synchronous_commit on", "synchronous_commit=on", false, own},
		{"server default synchronous_commit off", "synchronous_commit=off", false, own},
		{"server default synchronous_commit off, a pool of the user's", "synchronous_commit=off", false, usersPool},
		{"server default synchronous_commit off, through PgBouncer", "synchronous_commit=off", false, bouncer},
		{"synchronous_commit turned off while it runs", "", true, own},
		{"synchronous_commit turned off while it runs, a pool of the user's", "", true, usersPool},
		{"synchronous_commit turned off while it runs, through PgBouncer", "", true, bouncer},
		{"synchronous_commit off left on PgBouncer's server connections by another client", "", false, taintedBouncer},
	} {
		t.Run(c.name, func(t *testing.T) {
			var settings []string // a setting given here would outrank ALTER SYSTEM
			if c.setting != "" {
				settings = append(settings, c.setting)
			}
			srv := testenv.StartPostgres(t, settings...)
			cfg := c.config(t, srv)
			cfg.Schema = "idem"
			s, err := pgstore.Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if c.turnedOff {
				testenv.CompleteMany(t, s, 100, func(i int) string { return fmt.Sprintf("warm%03d", i) })
				srv.Reconfigure(t, "synchronous_commit", "off")
			}
			crashCheck(t, s, srv, c.name)
		})
	}
}

// leaveSessionsAsync sets synchronous_commit off, at session level, on
// every server connection of the PgBouncer at url (its default_pool_size:
// 20), as a careless client of the same bouncer would: each of 20 clients
// holds a transaction at once, so each has a server connection of its own.
func leaveSessionsAsync(t *testing.T, url string) {
	ctx := context.Background()
	const serverConns = 20
	conns := make([]*pgx.Conn, serverConns)
	for i := range conns {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		if conns[i], err = pgx.ConnectConfig(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close(ctx)
		if _, err := conns[i].Exec(ctx, `BEGIN`); err != nil {
			t.Fatal(err)
		}
		if _, err := conns[i].Exec(ctx, `SET synchronous_commit = off`); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, `COMMIT`); err != nil {
			t.Fatal(err)
		}
	}
	var v string
	if err := conns[0].QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v); err != nil || v != "off" {
		t.Fatalf("after the SETs a server connection has synchronous_commit %q (%v), want off", v, err)
	}
}

// crashCheck makes the writes TestServerCrash describes on s, crashing srv
// after each kind, and fails t if any acknowledged write is lost.
func crashCheck(t *testing.T, s *pgstore.Store, srv *testenv.Postgres, name string) {
	ctx := context.Background()
	key := func(i int) string { return fmt.Sprintf("k%05d", i) }
	// want says what each key written so far must be.
	type expect struct {
		state      store.State // completed, released, or in flight with a lease
		leaseFloor time.Time   // lasting at least until then
		absent     bool        // deleted
	}
	completed := expect{state: store.StateCompleted}
	claimed := func() expect {
		return expect{state: store.StateInFlight, leaseFloor: time.Now().Add(30 * time.Minute)}
	}
	released := func() expect { return expect{state: store.StateReleased} }
	deleted := func() expect { return expect{absent: true} }
	want := map[string]expect{}
	// claimAll claims keys one by one and returns their fences.
	claimAll := func(keys []string, lease time.Duration) []uint64 {
		fences := make([]uint64, len(keys))
		for j, k := range keys {
			a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: lease, Retention: time.Hour})
			if err == nil && a.Outcome != store.Acquired {
				err = fmt.Errorf("%s: %v", k, a.Outcome)
			}
			if err != nil {
				t.Fatal(err)
			}
			fences[j] = a.Fence
		}
		return fences
	}
	// claimThen claims keys, calls op on each with its fence, and then
	// expects what w says of each.
	claimThen := func(keys []string, lease time.Duration, op func(k string, fence uint64) error, w func() expect) {
		fences := claimAll(keys, lease)
		for j, k := range keys {
			if err := op(k, fences[j]); err != nil {
				t.Fatal(err)
			}
			want[k] = w()
		}
	}
	const n = 200
	next := 2000
	testenv.CompleteMany(t, s, next, key)
	for i := range next {
		want[key(i)] = completed
	}
	for _, phase := range []struct {
		kind  string
		write func(keys []string)
	}{
		{"claims", func(keys []string) {
			claimAll(keys, time.Hour)
			for _, k := range keys {
				want[k] = claimed()
			}
		}},
		{"claims by many goroutines", func(keys []string) { // coalesced acquisitions
			var wg sync.WaitGroup
			errs := make([]error, len(keys))
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := g; j < len(keys); j += 8 {
						a, err := s.Acquire(ctx, store.AcquireRequest{Key: keys[j], Lease: time.Hour, Retention: time.Hour})
						if err == nil && a.Outcome != store.Acquired {
							err = fmt.Errorf("%s: %v", keys[j], a.Outcome)
						}
						errs[j] = err
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				want[k] = claimed()
			}
		}},
		{"completions", func(keys []string) {
			fences := claimAll(keys, time.Hour)
			var wg sync.WaitGroup
			errs := make([]error, len(keys))
			for g := range 8 { // coalesced statements too
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := g; j < len(keys); j += 8 {
						errs[j] = s.Complete(ctx, keys[j], fences[j], []byte("done"), time.Hour)
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				want[k] = completed
			}
		}},
		{"heartbeats", func(keys []string) {
			claimThen(keys, time.Minute, func(k string, fence uint64) error {
				return s.Heartbeat(ctx, k, fence, time.Hour)
			}, claimed)
		}},
		{"archives", func(keys []string) {
			for _, k := range keys {
				rec := store.Record{Key: k, State: store.StateCompleted, Fence: 1, Attempts: 1, Result: []byte("archived")}
				if stored, err := s.ArchiveStored(ctx, rec, time.Hour); err != nil || !stored {
					t.Fatalf("archive %s: stored %v, %v", k, stored, err)
				}
				want[k] = completed
			}
		}},
		// A lost release keeps the key in flight until its lease ends (the
		// retry waits); a lost delete brings the record back (a duplicate
		// is answered from it instead of running anew).
		{"releases", func(keys []string) {
			claimThen(keys, time.Hour, func(k string, fence uint64) error { return s.Release(ctx, k, fence) }, released)
		}},
		{"deletes", func(keys []string) {
			testenv.CompleteMany(t, s, len(keys), func(j int) string { return keys[j] })
			for _, k := range keys {
				if err := s.Delete(ctx, k); err != nil {
					t.Fatal(err)
				}
				want[k] = deleted()
			}
		}},
		// The tiered store's own: an unclaim gives back a claim under
		// which nothing ran (lost: in flight until the lease ends), a
		// fenced delete drops a claim (lost: the record comes back).
		{"unclaims", func(keys []string) {
			claimThen(keys, time.Hour, func(k string, fence uint64) error { return s.Unclaim(ctx, k, fence) }, released)
		}},
		{"fenced deletes", func(keys []string) {
			claimThen(keys, time.Hour, func(k string, fence uint64) error { return s.DeleteUpTo(ctx, k, fence) }, deleted)
		}},
	} {
		keys := make([]string, n)
		for j := range keys {
			keys[j] = key(next + j)
		}
		next += n
		phase.write(keys)
		srv.Crash(t)

		// The pool's connections died with the server: calls fail closed
		// until it has new ones, then the same Store answers.
		failed := 0
		testenv.Eventually(t, 30*time.Second, "the store answers after the restart", func() error {
			_, err := s.Get(ctx, key(0))
			if err != nil && !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("a call after the restart: %v, want ErrStoreUnavailable until the store reconnects", err)
			}
			if err != nil {
				failed++
			}
			return err
		})
		var lost []string
		for k, w := range want {
			r, err := s.Get(ctx, k)
			switch {
			case errors.Is(err, store.ErrNotFound):
				if !w.absent {
					lost = append(lost, k)
				}
			case err != nil:
				t.Fatal(err)
			case w.absent, r.State != w.state, r.LeaseUntil.Before(w.leaseFloor):
				lost = append(lost, k)
			}
		}
		t.Logf("%s: crash after %d %s: %d calls failed closed after the restart; %d of %d acknowledged writes lost",
			name, n, phase.kind, failed, len(lost), len(want))
		if len(lost) > 0 {
			slices.Sort(lost)
			t.Fatalf("crash after %d %s: lost %d acknowledged writes to a SIGKILL of the server (keys %s … %s)",
				n, phase.kind, len(lost), lost[0], lost[len(lost)-1])
		}
	}
}

// TestSynchronousCommit: on a server whose default synchronous_commit is
// off, the sessions of the store Open connects, of a pool of the user's
// and of PgBouncer keep the server's setting and the store's writes raise
// it for their own transactions (TestServerCrash shows they lose nothing),
// so nothing is to be warned of — also where the sessions commit
// synchronously now, for the setting may be turned off while the store
// runs (TestServerCrash). A connection string that sets synchronous_commit
// keeps it, and ServerWarnings says so where it loses records: off, and
// local on a server with synchronous standbys (TestFailover). A standby
// that replicates the server asynchronously is warned of too.
func TestSynchronousCommit(t *testing.T) {
	srv := testenv.StartPostgres(t, "synchronous_commit=off")
	ctx := context.Background()
	// warned: what the one warning says, "" for none.
	check := func(t *testing.T, s *pgstore.Store, want string, durably bool, warned string) {
		t.Helper()
		var got string
		if err := s.Pool().QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("the store's sessions have synchronous_commit %s, want %s", got, want)
		}
		if s.WritesDurably() != durably {
			t.Fatalf("the store's writes raise synchronous_commit themselves: %v, want %v", s.WritesDurably(), durably)
		}
		w, err := s.ServerWarnings(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if warned == "" && len(w) > 0 || warned != "" && (len(w) != 1 || !strings.Contains(w[0], warned)) {
			t.Fatalf("warnings %q, want one saying %q", w, warned)
		}
	}
	open := func(t *testing.T, cfg pgstore.Config) *pgstore.Store {
		cfg.Schema = "idem"
		s, err := pgstore.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	pool := func(t *testing.T, url string) *pgxpool.Pool {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	t.Run("Open", func(t *testing.T) { check(t, open(t, pgstore.Config{ConnString: srv.URL}), "off", true, "") })
	t.Run("SetInTheConnectionString", func(t *testing.T) {
		check(t, open(t, pgstore.Config{ConnString: srv.URL + "&synchronous_commit=off"}), "off", false, "synchronous_commit is off")
	})
	t.Run("LocalKept", func(t *testing.T) {
		check(t, open(t, pgstore.Config{ConnString: srv.URL + "&synchronous_commit=local"}), "local", false, "")
	})
	t.Run("LocalWithSynchronousStandbys", func(t *testing.T) {
		// The commits of local do not wait for the standby (which does not
		// exist): Migrate runs.
		withStandbys := testenv.StartPostgres(t, "synchronous_standby_names=s1")
		check(t, open(t, pgstore.Config{ConnString: withStandbys.URL + "&synchronous_commit=local"}), "local", false,
			"a failover to one loses the last acknowledged claims")
	})
	t.Run("AsynchronousStandby", func(t *testing.T) {
		replicated := testenv.StartPostgres(t)
		replicated.StartStandby(t, "s1")
		check(t, open(t, pgstore.Config{ConnString: replicated.URL}), "on", true, "replicate the server asynchronously")
	})
	t.Run("PoolOfTheUsers", func(t *testing.T) { check(t, open(t, pgstore.Config{Pool: pool(t, srv.URL)}), "off", true, "") })
	t.Run("PgBouncer", func(t *testing.T) {
		check(t, open(t, pgstore.Config{ConnString: srv.PgBouncer(t), PgBouncer: true}), "off", true, "")
	})
	t.Run("PgBouncerCommittingSynchronously", func(t *testing.T) { // the shared server: on
		s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{ConnString: testenv.StartPgBouncer(t), PgBouncer: true})
		check(t, s, "on", true, "")
	})
	t.Run("PoolOfTheUsersCommittingSynchronously", func(t *testing.T) {
		check(t, open(t, pgstore.Config{Pool: pool(t, srv.URL+"&synchronous_commit=on")}), "on", true, "")
	})
}

// TestFsyncWarning: a server run with fsync off (a setting some choose for
// speed) loses or corrupts committed records when the machine crashes or
// loses power, whatever the store does: ServerWarnings names it.
func TestFsyncWarning(t *testing.T) {
	srv := testenv.StartPostgres(t, "fsync=off")
	s, err := pgstore.Open(context.Background(), pgstore.Config{ConnString: srv.URL, Schema: "idem"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := s.ServerWarnings(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(w) != 1 || !strings.Contains(w[0], "fsync is off") {
		t.Fatalf("warnings %q, want one saying fsync is off", w)
	}
}
