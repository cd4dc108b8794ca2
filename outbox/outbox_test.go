package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/outboxtest"
)

func pgPool(t testing.TB) (*pgxpool.Pool, string) {
	testenv.ProbePostgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	schema := testenv.RandomName("idemtest_")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
		pool.Close()
	})
	return pool, schema
}

func must(t testing.TB, s *outbox.Store, err error) *outbox.Store {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPgx(t *testing.T) {
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend {
		pool, schema := pgPool(t)
		s, err := outbox.NewPgx(pool, schema)
		t.Cleanup(func() { s.Close() })
		return outboxtest.Backend{
			Store: must(t, s, err),
			Begin: func(ctx context.Context) (outbox.Tx, func(bool) error, error) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return nil, nil, err
				}
				return outbox.PgxTx(tx), func(commit bool) error {
					if commit {
						return tx.Commit(ctx)
					}
					return tx.Rollback(ctx)
				}, nil
			},
			Reopen: func() *outbox.Store { o, _ := outbox.NewPgx(pool, schema); return o },
		}
	})
}

func sqlBackend(t testing.TB, db *sql.DB, d outbox.Dialect, schema string) outboxtest.Backend {
	s, err := outbox.NewSQL(db, d, schema)
	return outboxtest.Backend{
		Store: must(t, s, err),
		Begin: func(ctx context.Context) (outbox.Tx, func(bool) error, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, nil, err
			}
			return outbox.SQLTx(tx), func(commit bool) error {
				if commit {
					return tx.Commit()
				}
				return tx.Rollback()
			}, nil
		},
		Reopen: func() *outbox.Store { o, _ := outbox.NewSQL(db, d, schema); return o },
	}
}

func TestDatabaseSQLPostgres(t *testing.T) {
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend {
		_, schema := pgPool(t)
		db, err := sql.Open("pgx", testenv.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return sqlBackend(t, db, outbox.Postgres, schema)
	})
}

func TestSQLite(t *testing.T) {
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "outbox.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return sqlBackend(t, db, outbox.SQLite, "")
	})
}

// TestListenNotifyWakesTheRelay: with a 30s poll interval, a committed row
// is sent within a second because the insert trigger's NOTIFY wakes the
// relay.
func TestListenNotifyWakesTheRelay(t *testing.T) {
	pool, schema := pgPool(t)
	s, err := outbox.NewPgx(pool, schema)
	must(t, s, err)
	defer s.Close()
	ctx := context.Background()
	sent := make(chan time.Time, 4)
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: s, PollInterval: 30 * time.Second,
		Sender: outbox.SenderFunc(func(ctx context.Context, m *outbox.Message) outbox.Result {
			sent <- time.Now()
			return outbox.Result{Status: outbox.Sent}
		})})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx, func(err error) { t.Error(err) }); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	time.Sleep(300 * time.Millisecond) // the relay is idle, listening
	for i := range 2 {
		start := time.Now()
		if err := s.Enqueue(ctx, outbox.Message{Key: fmt.Sprint("wake-", i), Destination: "test://x"}); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-sent:
			t.Logf("sent %v after the commit", at.Sub(start).Round(time.Millisecond))
		case <-time.After(5 * time.Second):
			t.Fatal("the relay did not wake up on NOTIFY")
		}
	}
}
