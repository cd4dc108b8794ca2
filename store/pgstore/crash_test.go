package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
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

// crashCheck makes the writes storetest.ServerCrash describes on s,
// crashing srv after each kind.
func crashCheck(t *testing.T, s *pgstore.Store, srv *testenv.Postgres, name string) {
	storetest.ServerCrash(t, s, func() { srv.Crash(t) }, name)
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
