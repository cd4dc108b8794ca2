package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
)

// TestServerCrash kills a PostgreSQL server of the test's own — the
// postmaster and every backend, SIGKILL — right after 2,000 acknowledged
// completions (made by 16 goroutines: coalesced statements too) and 200
// acknowledged claims, and starts it again on the same files. Nothing
// acknowledged may be lost: a lost completion runs its work again, a lost
// claim lets a second owner run the key beside the first. That holds
// whatever the server's default synchronous_commit: with "off" PostgreSQL
// acknowledges a commit before its WAL is written and loses the last
// fraction of a second of them to a crash. The same Store, not reopened,
// must serve again once the server is back.
func TestServerCrash(t *testing.T) {
	for _, c := range []struct{ name, setting string }{
		{"synchronous_commit on", "synchronous_commit=on"},
		{"server default synchronous_commit off", "synchronous_commit=off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := testenv.StartPostgres(t, c.setting)
			ctx := context.Background()
			s, err := pgstore.Open(ctx, pgstore.Config{ConnString: srv.URL, Schema: "idem"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()

			const completions, claims = 2000, 200
			key := func(i int) string { return fmt.Sprintf("k%05d", i) }
			testenv.CompleteMany(t, s, completions, key)
			for i := completions; i < completions+claims; i++ {
				a, err := s.Acquire(ctx, idem.AcquireRequest{Key: key(i), Lease: time.Hour, Retention: time.Hour})
				if err == nil && a.Outcome != idem.Acquired {
					err = fmt.Errorf("%s: %v", key(i), a.Outcome)
				}
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
			for i := range completions + claims {
				r, err := s.Get(ctx, key(i))
				switch {
				case errors.Is(err, idem.ErrNotFound):
					if i < completions {
						lostDone++
					} else {
						lostClaims++
					}
				case err != nil:
					t.Fatal(err)
				case i < completions && r.State != idem.StateCompleted:
					lostDone++
				}
			}
			t.Logf("%s: %d calls failed closed after the restart; lost %d of %d completions, %d of %d claims",
				c.name, failed, lostDone, completions, lostClaims, claims)
			if lostDone > 0 || lostClaims > 0 {
				t.Fatalf("lost %d of %d acknowledged completions and %d of %d acknowledged claims to a SIGKILL of the server",
					lostDone, completions, lostClaims, claims)
			}
		})
	}
}

// TestSynchronousCommit: on a server whose default synchronous_commit is
// off, the store Open connects commits synchronously and has nothing to
// warn of; a connection string that sets synchronous_commit keeps it, and
// a pool of the user's keeps the server's — the store's ServerWarnings
// says so for both.
func TestSynchronousCommit(t *testing.T) {
	srv := testenv.StartPostgres(t, "synchronous_commit=off")
	ctx := context.Background()
	check := func(t *testing.T, s *pgstore.Store, want string, warned bool) {
		t.Helper()
		var got string
		if err := s.Pool().QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("the store's sessions have synchronous_commit %s, want %s", got, want)
		}
		w, err := s.ServerWarnings(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if warned != (len(w) == 1 && strings.Contains(w[0], "synchronous_commit is off")) || len(w) > 1 {
			t.Fatalf("warnings %q, want a warning: %v", w, warned)
		}
	}
	open := func(t *testing.T, url string) *pgstore.Store {
		s, err := pgstore.Open(ctx, pgstore.Config{ConnString: url, Schema: "idem"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	t.Run("Open", func(t *testing.T) { check(t, open(t, srv.URL), "on", false) })
	t.Run("SetInTheConnectionString", func(t *testing.T) { check(t, open(t, srv.URL+"&synchronous_commit=off"), "off", true) })
	t.Run("LocalKept", func(t *testing.T) { check(t, open(t, srv.URL+"&synchronous_commit=local"), "local", false) })
	t.Run("PoolOfTheUsers", func(t *testing.T) {
		pool, err := pgxpool.New(ctx, srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		s, err := pgstore.Open(ctx, pgstore.Config{Pool: pool, Schema: "idem"})
		if err != nil {
			t.Fatal(err)
		}
		check(t, s, "off", true)
	})
}
