package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
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
	if _, err := s.ArchiveStored(ctx, store.Record{Key: "warm", State: store.StateCompleted, Fence: 1}, time.Hour); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := s.ArchiveStored(actx, store.Record{Key: "k", State: store.StateCompleted, Fence: 1, Result: []byte("late")}, time.Hour)
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
	if rec, err := direct.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the archive its caller was told failed landed late: %+v, %v", rec, err)
	}
}

// TestGetAwaitingArchives: an archive that came in time and waits for its
// key's row (held by another transaction) is waited for by
// GetAwaitingArchives, which then sees it — where Get answers that there is
// no record, and the archive lands after. Directly and through PgBouncer in
// transaction pooling.
func TestGetAwaitingArchives(t *testing.T) {
	t.Run("direct", func(t *testing.T) { testGetAwaitingArchives(t, "") })
	t.Run("pgbouncer", func(t *testing.T) { testGetAwaitingArchives(t, testenv.StartPgBouncer(t)) })
}

func testGetAwaitingArchives(t *testing.T, bouncer string) {
	schema := testenv.RandomName("idemtest_")
	cfg := pgstore.Config{}
	if bouncer != "" {
		cfg = pgstore.Config{ConnString: bouncer, PgBouncer: true}
	}
	s := testenv.OpenPostgres(t, schema, cfg)
	direct := testenv.OpenPostgres(t, schema, pgstore.Config{})
	ctx := context.Background()
	waiting := func(event, query string) error { // a session waiting for a lock, in a statement with query
		var n int
		err := direct.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = $1
			AND state = 'active' AND query LIKE $2`, event, "%"+query+"%").Scan(&n)
		if err == nil && n == 0 {
			err = fmt.Errorf("no session waits for a lock (%s) in %s", event, query)
		}
		return err
	}

	tx, err := direct.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO `+direct.Table()+`
		(k, state, fence, attempts, lease_until, expires_at, updated_at, outcome) VALUES ($1, 5, 0, 0, now(), now(), now(), 0)`, direct.KeyArg("k")); err != nil {
		t.Fatal(err)
	}
	archived := make(chan error, 1)
	go func() {
		_, err := s.ArchiveStored(ctx, store.Record{Key: "k", State: store.StateCompleted, Fence: 7, Fingerprint: "A", Result: []byte("booked")}, time.Hour)
		archived <- err
	}()
	testenv.Eventually(t, 10*time.Second, "the archive waiting for the row", func() error { return waiting("transactionid", schema) })
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get while the archive is under way: %v, want ErrNotFound (it does not wait)", err)
	}
	read := make(chan error, 1)
	go func() {
		rec, err := s.GetAwaitingArchives(ctx, "k")
		if err == nil && (rec.State != store.StateCompleted || rec.Fence != 7 || string(rec.Result) != "booked") {
			err = fmt.Errorf("read %+v, want the archive", rec)
		}
		read <- err
	}()
	testenv.Eventually(t, 10*time.Second, "the read waiting for the archive", func() error { return waiting("advisory", "pg_advisory_xact_lock_shared(hashtextextended(") })
	select {
	case err := <-read:
		t.Fatalf("GetAwaitingArchives returned while the archive was under way: %v", err)
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-archived; err != nil {
		t.Fatalf("the archive: %v", err)
	}
	if err := <-read; err != nil {
		t.Fatalf("GetAwaitingArchives: %v", err)
	}
	// Nothing under way: it reads at once, and answers ErrNotFound for a
	// key without a record.
	if _, err := s.GetAwaitingArchives(ctx, "none"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetAwaitingArchives of an unknown key: %v, want ErrNotFound", err)
	}
}
