package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
)

// TestArchiveHeldUpPastItsDeadline: an archive held up on its way to the
// database (a stalled network) until after its context's deadline — its
// caller was told it failed, and the tiered store has let the claim go —
// is not applied when it reaches PostgreSQL at last.
func TestArchiveHeldUpPastItsDeadline(t *testing.T) {
	conn, p := testenv.PostgresProxy(t)
	const app = "idem-late-archive-test"
	conn += "&application_name=" + app + "&pool_max_conns=1"
	schema := testenv.RandomName("idemtest_")
	s := testenv.OpenPostgres(t, schema, pgstore.Config{ConnString: conn})
	direct := testenv.OpenPostgres(t, schema, pgstore.Config{})
	ctx := context.Background()
	// The pool's one connection, open, its archive statement prepared.
	if _, err := s.ArchiveStored(ctx, idem.Record{Key: "warm", State: idem.StateCompleted, Fence: 1}, time.Hour); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := s.ArchiveStored(actx, idem.Record{Key: "k", State: idem.StateCompleted, Fence: 1, Result: []byte("late")}, time.Hour)
	cancel()
	if err == nil {
		t.Fatal("an archive held up on its way succeeded")
	}
	p.Unstall()
	// The proxy delivers what it held, then closes; the session that gets
	// the archive runs it and ends. Wait for that end.
	watch, err := pgx.Connect(ctx, testenv.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions of the held-up client still open after 30s", n)
		}
		time.Sleep(10 * time.Millisecond) // polling the server: it has no signal to give
	}
	if rec, err := direct.Get(ctx, "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the archive its caller was told failed landed late: %+v, %v", rec, err)
	}
}
