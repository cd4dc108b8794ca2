package pgxv5_test

import (
	"context"
	"testing"

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
