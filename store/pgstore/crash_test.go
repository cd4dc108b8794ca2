package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
)

// TestServerCrash kills a PostgreSQL server of the test's own — the
// postmaster and every backend, SIGKILL — right after 2,200 acknowledged
// completions (made by many goroutines: coalesced statements too) and 200
// acknowledged claims, and starts it again on the same files. Nothing
// acknowledged may be lost: a lost completion runs its work again, a lost
// claim lets a second owner run the key beside the first. That holds
// whatever the server's default synchronous_commit: with "off" PostgreSQL
// acknowledges a commit before its WAL is written and loses the last
// fraction of a second of them to a crash — through the store's own pool,
// a pool of the user's and PgBouncer alike. The same Store, not reopened,
// must serve again once the server is back.
func TestServerCrash(t *testing.T) {
	ctx := context.Background()
	own := func(t *testing.T, srv *testenv.Postgres) pgstore.Config {
		return pgstore.Config{ConnString: srv.URL}
	}
	for _, c := range []struct {
		name, setting string
		config        func(*testing.T, *testenv.Postgres) pgstore.Config
	}{
		{"synchronous_commit on", "synchronous_commit=on", own},
		{"server default synchronous_commit off", "synchronous_commit=off", own},
		{"server default synchronous_commit off, a pool of the user's", "synchronous_commit=off",
			func(t *testing.T, srv *testenv.Postgres) pgstore.Config {
				pool, err := pgxpool.New(ctx, srv.URL)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				return pgstore.Config{Pool: pool}
			}},
		{"server default synchronous_commit off, through PgBouncer", "synchronous_commit=off",
			func(t *testing.T, srv *testenv.Postgres) pgstore.Config {
				return pgstore.Config{ConnString: srv.PgBouncer(t), PgBouncer: true}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := testenv.StartPostgres(t, c.setting)
			cfg := c.config(t, srv)
			cfg.Schema = "idem"
			s, err := pgstore.Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()

			// The last writes before the crash: 200 claims, then the
			// completions of 200 other keys claimed before them (by 8
			// goroutines: coalesced statements too).
			const completions, claims = 2000, 200
			key := func(i int) string { return fmt.Sprintf("k%05d", i) }
			testenv.CompleteMany(t, s, completions, key)
			fences := make([]uint64, 2*claims)
			for j := range fences {
				k := key(completions + (j+claims)%(2*claims)) // the keys to complete first
				a, err := s.Acquire(ctx, idem.AcquireRequest{Key: k, Lease: time.Hour, Retention: time.Hour})
				if err == nil && a.Outcome != idem.Acquired {
					err = fmt.Errorf("%s: %v", k, a.Outcome)
				}
				if err != nil {
					t.Fatal(err)
				}
				fences[(j+claims)%(2*claims)] = a.Fence
			}
			var wg sync.WaitGroup
			errs := make(chan error, claims)
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := claims + g; j < 2*claims; j += 8 {
						errs <- s.Complete(ctx, key(completions+j), fences[j], []byte("done"), time.Hour)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			srv.Crash(t)

			// The pool's connections died with the server: calls fail closed
			// until it has new ones, then the same Store answers.
			var failed int
			deadline := time.Now().Add(30 * time.Second)
			for {
				_, err := s.Get(ctx, "k00000")
				if err == nil {
					break
				}
				if !errors.Is(err, idem.ErrStoreUnavailable) {
					t.Fatalf("a call after the restart: %v, want ErrStoreUnavailable until the store reconnects", err)
				}
				if failed++; time.Now().After(deadline) {
					t.Fatalf("the store did not answer within 30 s of the restart: %v", err)
				}
			}
			lostDone, lostClaims := 0, 0
			for i := range completions + 2*claims {
				completed := i < completions || i >= completions+claims
				r, err := s.Get(ctx, key(i))
				switch {
				case errors.Is(err, idem.ErrNotFound):
					if completed {
						lostDone++
					} else {
						lostClaims++
					}
				case err != nil:
					t.Fatal(err)
				case completed && r.State != idem.StateCompleted:
					lostDone++
				}
			}
			t.Logf("%s: %d calls failed closed after the restart; lost %d of %d completions, %d of %d claims",
				c.name, failed, lostDone, completions+claims, lostClaims, claims)
			if lostDone > 0 || lostClaims > 0 {
				t.Fatalf("lost %d of %d acknowledged completions and %d of %d acknowledged claims to a SIGKILL of the server",
					lostDone, completions+claims, lostClaims, claims)
			}
		})
	}
}

// TestSynchronousCommit: on a server whose default synchronous_commit is
// off, the store Open connects commits synchronously and has nothing to
// warn of; a connection string that sets synchronous_commit keeps it, and
// ServerWarnings says so where it is off; a pool of the user's and
// PgBouncer keep the server's setting and the store's writes raise it for
// their own transactions (TestServerCrash shows they lose nothing), so
// nothing is to be warned of. Where the sessions commit synchronously,
// the statements do not carry that condition, once Migrate has seen it.
func TestSynchronousCommit(t *testing.T) {
	srv := testenv.StartPostgres(t, "synchronous_commit=off")
	ctx := context.Background()
	check := func(t *testing.T, s *pgstore.Store, want string, durably, warned bool) {
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
		if warned != (len(w) == 1 && strings.Contains(w[0], "synchronous_commit is off")) || len(w) > 1 {
			t.Fatalf("warnings %q, want a warning: %v", w, warned)
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
	t.Run("Open", func(t *testing.T) { check(t, open(t, pgstore.Config{ConnString: srv.URL}), "on", false, false) })
	t.Run("SetInTheConnectionString", func(t *testing.T) {
		check(t, open(t, pgstore.Config{ConnString: srv.URL + "&synchronous_commit=off"}), "off", false, true)
	})
	t.Run("LocalKept", func(t *testing.T) {
		check(t, open(t, pgstore.Config{ConnString: srv.URL + "&synchronous_commit=local"}), "local", false, false)
	})
	t.Run("PoolOfTheUsers", func(t *testing.T) { check(t, open(t, pgstore.Config{Pool: pool(t, srv.URL)}), "off", true, false) })
	t.Run("PgBouncer", func(t *testing.T) {
		check(t, open(t, pgstore.Config{ConnString: srv.PgBouncer(t), PgBouncer: true}), "off", true, false)
	})
	t.Run("PgBouncerCommittingSynchronously", func(t *testing.T) { // the shared server: on
		s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{ConnString: testenv.StartPgBouncer(t), PgBouncer: true})
		check(t, s, "on", false, false)
	})
	t.Run("PoolOfTheUsersCommittingSynchronously", func(t *testing.T) {
		s, err := pgstore.New(pgstore.Config{Pool: pool(t, srv.URL+"&synchronous_commit=on"), Schema: "idem"})
		if err != nil {
			t.Fatal(err)
		}
		if !s.WritesDurably() {
			t.Fatal("before Migrate has read the sessions' setting, the writes must raise it themselves")
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		check(t, s, "on", false, false)
	})
}
