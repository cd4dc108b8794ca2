package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// TestServerCrash: what the inbox reports processed — after which a
// consumer acknowledges the message to its broker, which then forgets it —
// survives a SIGKILL of the PostgreSQL server right after, even where the
// server's default synchronous_commit is off (under which PostgreSQL
// acknowledges a commit before its WAL is written, and a crash loses the
// last fraction of a second of them: messages gone from the broker and
// from the database alike). Through pgx: Process, ProcessBatch, and
// ClaimTx in a transaction of the user's; through database/sql: Process.
func TestServerCrash(t *testing.T) {
	const n = 600
	ev := func(i int) inbox.Event { return inbox.Event{Consumer: "c", CorrelationID: fmt.Sprintf("m%04d", i)} }
	credit := creditPgx("")
	pgxWays := map[string]func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, ib *inbox.Inbox[pgx.Tx]){
		"Process": func(t *testing.T, ctx context.Context, _ *pgxpool.Pool, ib *inbox.Inbox[pgx.Tx]) {
			for i := range n {
				out, err := ib.Process(ctx, ev(i), func(ctx context.Context, tx pgx.Tx) error { return credit(ctx, tx, ev(i).CorrelationID) })
				if err != nil || out != inbox.Processed {
					t.Fatalf("%d: %v, %v", i, out, err)
				}
			}
		},
		"ProcessBatch": func(t *testing.T, ctx context.Context, _ *pgxpool.Pool, ib *inbox.Inbox[pgx.Tx]) {
			for i := 0; i < n; i += 4 {
				items := make([]inbox.BatchItem[pgx.Tx], 4)
				for j := range items {
					e := ev(i + j)
					items[j] = inbox.BatchItem[pgx.Tx]{Event: e, Fn: func(ctx context.Context, tx pgx.Tx) error { return credit(ctx, tx, e.CorrelationID) }}
				}
				res, err := ib.ProcessBatch(ctx, items)
				allProcessed(t, i, res, err)
			}
		},
		"ClaimTx": func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, ib *inbox.Inbox[pgx.Tx]) {
			for i := range n {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					out, err := ib.ClaimTx(ctx, tx, ev(i))
					if err == nil && out != inbox.Processed {
						err = fmt.Errorf("%v", out)
					}
					if err == nil {
						err = credit(ctx, tx, ev(i).CorrelationID)
					}
					return err
				})
				if err != nil {
					t.Fatalf("%d: %v", i, err)
				}
			}
		},
	}
	for name, process := range pgxWays {
		t.Run(name, func(t *testing.T) {
			srv, pool := asyncServer(t)
			ib, err := inbox.New(pgxv5.New(pool), inbox.Config{})
			if err != nil {
				t.Fatal(err)
			}
			if err := ib.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			process(t, context.Background(), pool, ib)
			crashAndCount(t, srv, pool, n)
		})
	}
	t.Run("ProcessAfterTheSettingChanged", func(t *testing.T) {
		// The server commits synchronously when Migrate runs and is
		// turned to off (ALTER SYSTEM, a reload) while the program runs.
		srv := testenv.StartPostgres(t)
		pool := creditsPool(t, srv)
		ib, err := inbox.New(pgxv5.New(pool), inbox.Config{})
		if err == nil {
			err = ib.Migrate(context.Background())
		}
		if err != nil {
			t.Fatal(err)
		}
		srv.Reconfigure(t, "synchronous_commit", "off")
		pgxWays["Process"](t, context.Background(), pool, ib)
		crashAndCount(t, srv, pool, n)
	})
	t.Run("ProcessThroughPgBouncer", func(t *testing.T) {
		srv, pool := asyncServer(t)
		bounced := testenv.PgBouncerPool(t, srv.PgBouncer(t))
		ib, err := inbox.New(pgxv5.New(bounced), inbox.Config{})
		if err == nil {
			err = ib.Migrate(context.Background())
		}
		if err != nil {
			t.Fatal(err)
		}
		pgxWays["Process"](t, context.Background(), bounced, ib)
		crashAndCount(t, srv, pool, n)
	})
	t.Run("DatabaseSQLBatch", func(t *testing.T) {
		srv, pool := asyncServer(t)
		ib := sqlInbox(t, srv)
		ctx := context.Background()
		for i := 0; i < n; i += 4 {
			items := make([]inbox.BatchItem[*sql.Tx], 4)
			for j := range items {
				e := ev(i + j)
				items[j] = inbox.BatchItem[*sql.Tx]{Event: e, Fn: func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO credits (ref) VALUES ($1)`, e.CorrelationID)
					return err
				}}
			}
			res, err := ib.ProcessBatch(ctx, items)
			allProcessed(t, i, res, err)
		}
		crashAndCount(t, srv, pool, n)
	})
	t.Run("DatabaseSQL", func(t *testing.T) {
		srv, pool := asyncServer(t)
		ib := sqlInbox(t, srv)
		ctx := context.Background()
		for i := range n {
			out, err := ib.Process(ctx, ev(i), func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO credits (ref) VALUES ($1)`, ev(i).CorrelationID)
				return err
			})
			if err != nil || out != inbox.Processed {
				t.Fatalf("%d: %v, %v", i, out, err)
			}
		}
		crashAndCount(t, srv, pool, n)
	})
}

// allProcessed wants every item of the batch starting at message from
// processed.
func allProcessed(t *testing.T, from int, res []inbox.BatchResult, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	for j, r := range res {
		if r.Err != nil || r.Outcome != inbox.Processed {
			t.Fatalf("%d: %v, %v", from+j, r.Outcome, r.Err)
		}
	}
}

// sqlInbox migrates an inbox on srv through database/sql.
func sqlInbox(t *testing.T, srv *testenv.Postgres) *inbox.Inbox[*sql.Tx] {
	ib, err := inbox.New(databasesql.New(sqlPostgres(t, srv.URL), sqldriver.Postgres), inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ib
}

// asyncServer starts a server of the test's own whose default
// synchronous_commit is off, with a table of credits.
func asyncServer(t *testing.T) (*testenv.Postgres, *pgxpool.Pool) {
	srv := testenv.StartPostgres(t, "synchronous_commit=off")
	return srv, creditsPool(t, srv)
}

// creditsPool connects a pool to srv and creates the table of credits.
func creditsPool(t *testing.T, srv *testenv.Postgres) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE credits (id bigserial PRIMARY KEY, ref text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// crashAndCount kills the server right after n messages were reported
// processed, starts it again, and wants n credits and n keys.
func crashAndCount(t *testing.T, srv *testenv.Postgres, pool *pgxpool.Pool, n int) {
	t.Helper()
	srv.Crash(t)
	var credits, keys int
	testenv.Eventually(t, 30*time.Second, "the server answers after the restart", func() error {
		return pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM credits), (SELECT count(*) FROM processed_events)`).Scan(&credits, &keys)
	})
	if credits != n || keys != n {
		t.Fatalf("after the crash %d of %d credits and %d of %d keys remain: messages reported processed (and acknowledged to their broker) were lost", credits, n, keys, n)
	}
}

// TestFailover: what the inbox reports processed survives a failover to
// the synchronous standby (named in synchronous_standby_names) even where
// the sessions' synchronous_commit is local, under which PostgreSQL
// acknowledges a commit before the standby has it. The standby is parted
// from the primary while eight goroutines process new messages, the
// primary is killed (SIGKILL) and the standby promoted (testenv.FailOver):
// every message reported processed must have its credit and its key
// there. (pgstore's TestFailover does the same for
// claims.)
func TestFailover(t *testing.T) {
	ctx := context.Background()
	primary := testenv.StartPostgres(t, "synchronous_commit=local", "synchronous_standby_names=s1")
	standby, link := primary.StartStandby(t, "s1")
	pool := creditsPool(t, primary)
	ib, err := inbox.New(pgxv5.New(pool), inbox.Config{})
	if err == nil {
		err = ib.Migrate(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	credit := creditPgx("")
	processed, parted := testenv.FailOver(t, primary, standby, link, func(ctx context.Context, id string) bool {
		out, err := ib.Process(ctx, inbox.Event{Consumer: "c", CorrelationID: id}, func(ctx context.Context, tx pgx.Tx) error {
			return credit(ctx, tx, id)
		})
		if err == nil && out != inbox.Processed {
			t.Errorf("%s: %v", id, out)
		}
		return err == nil
	})

	after, err := pgx.Connect(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close(ctx)
	var credits, keys int
	if err := after.QueryRow(ctx, `SELECT (SELECT count(*) FROM credits WHERE ref = ANY($1)),
		(SELECT count(*) FROM processed_events WHERE consumer = 'c' AND correlation_id = ANY($1))`, processed).Scan(&credits, &keys); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages reported processed (%d while the standby was parted); after the failover %d credits and %d keys",
		len(processed), parted, credits, keys)
	if credits != len(processed) || keys != len(processed) {
		t.Fatalf("after the failover %d of %d credits and %d of %d keys remain: messages reported processed (and acknowledged to their broker) were lost",
			credits, len(processed), keys, len(processed))
	}
}
