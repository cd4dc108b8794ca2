package pgxv5_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/drivertest"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

func TestDriver(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) (sqldriver.Driver[pgx.Tx], string) {
		testenv.ProbePostgres(t)
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, testenv.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		schema := testenv.RandomName("idemdriver_")
		if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
			pool.Close()
		})
		return pgxv5.New(pool), schema
	})
}

// TestWaitWithoutAListenerReturnsSoon: a Wait that cannot listen — the
// server is down, or a pooled connection died with it — returns within a
// second, not at the end of its timeout: its caller (the outbox relay,
// waiting a whole poll interval) goes back to work as soon as the server
// is back, and notices a row committed meanwhile.
func TestWaitWithoutAListenerReturnsSoon(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d := pgxv5.New(pool)
	start := time.Now()
	if d.Wait(context.Background(), "idem_outbox", 10*time.Second) {
		t.Fatal("a notification from no server")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Wait took %v without a listening connection, want about a second", took)
	}
}
