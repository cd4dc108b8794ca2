package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// TestServerCrash: what Process and ProcessBatch report processed — after
// which a consumer acknowledges the message to its broker, which then
// forgets it — survives a SIGKILL of the PostgreSQL server right after,
// even where the server's default synchronous_commit is off (under which
// PostgreSQL acknowledges a commit before its WAL is written, and a crash
// loses the last fraction of a second of them: messages gone from the
// broker and from the database alike). The transactions the inbox begins
// itself commit synchronously; the user's own (ClaimTx, ApplyVersionTx) keep
// the user's setting.
func TestServerCrash(t *testing.T) {
	for _, batches := range []bool{false, true} {
		t.Run(fmt.Sprintf("batches=%v", batches), func(t *testing.T) {
			srv := testenv.StartPostgres(t, "synchronous_commit=off")
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if _, err := pool.Exec(ctx, `CREATE TABLE credits (id bigserial PRIMARY KEY, ref text NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			ib, err := inbox.New(pgxv5.New(pool), inbox.Config{})
			if err != nil {
				t.Fatal(err)
			}
			if err := ib.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			credit := func(ctx context.Context, tx pgx.Tx, ref string) error {
				_, err := tx.Exec(ctx, `INSERT INTO credits (ref) VALUES ($1)`, ref)
				return err
			}
			const n = 600
			ev := func(i int) inbox.Event { return inbox.Event{Consumer: "c", CorrelationID: fmt.Sprintf("m%04d", i)} }
			for i := 0; i < n; {
				if !batches {
					out, err := ib.Process(ctx, ev(i), func(ctx context.Context, tx pgx.Tx) error { return credit(ctx, tx, ev(i).CorrelationID) })
					if err != nil || out != inbox.Processed {
						t.Fatalf("%d: %v, %v", i, out, err)
					}
					i++
					continue
				}
				items := make([]inbox.BatchItem[pgx.Tx], 4)
				for j := range items {
					e := ev(i + j)
					items[j] = inbox.BatchItem[pgx.Tx]{Event: e, Fn: func(ctx context.Context, tx pgx.Tx) error { return credit(ctx, tx, e.CorrelationID) }}
				}
				res, err := ib.ProcessBatch(ctx, items)
				if err != nil {
					t.Fatal(err)
				}
				for j, r := range res {
					if r.Err != nil || r.Outcome != inbox.Processed {
						t.Fatalf("%d: %v, %v", i+j, r.Outcome, r.Err)
					}
				}
				i += len(items)
			}
			srv.Crash(t)

			var credits, keys int
			testenv.Eventually(t, 30*time.Second, "the server answers after the restart", func() error {
				return pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM credits), (SELECT count(*) FROM processed_events)`).Scan(&credits, &keys)
			})
			if credits != n || keys != n {
				t.Fatalf("after the crash %d of %d credits and %d of %d keys remain: messages reported processed (and acknowledged to their broker) were lost", credits, n, keys, n)
			}
		})
	}
}
