package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// BenchmarkInboxOverhead runs, in one run, the payments consumer's business
// transaction (insert a transfer, add to a balance) with and without the
// inbox claim, on PostgreSQL, and prints the ratio (target ≤ 1.3).
func BenchmarkInboxOverhead(b *testing.B) {
	testenv.ProbePostgres(b)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL+"&pool_max_conns=16")
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	schema := testenv.RandomName("idembench_")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema+`;
		CREATE TABLE `+schema+`.credit_transfers (id bigserial PRIMARY KEY, correlation_id text NOT NULL, account text NOT NULL, amount_cents bigint NOT NULL);
		CREATE TABLE `+schema+`.accounts (account text PRIMARY KEY, balance_cents bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	defer pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
	ib, err := inbox.New(pgxv5.New(pool), inbox.Config{Table: schema + ".processed_events", VersionTable: schema + ".entity_versions"})
	if err != nil {
		b.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	business := func(ctx context.Context, tx pgx.Tx, id string, n uint64) error {
		acc := "ACC-" + strconv.FormatUint(n%100, 10)
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.credit_transfers (correlation_id, account, amount_cents) VALUES ($1, $2, 100)`, id, acc); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.accounts VALUES ($1, 100) ON CONFLICT (account) DO UPDATE SET balance_cents = accounts.balance_cents + 100`, acc)
		return err
	}
	separate, err := inbox.New(pgxv5.New(pool), inbox.Config{Table: schema + ".processed_events", VersionTable: schema + ".entity_versions", ClaimSeparately: true})
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Uint64
	each := func(b *testing.B, parallel bool, op func(n uint64) error) float64 {
		return runEach(b, parallel, &seq, op)
	}
	bare := func(n uint64) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return business(ctx, tx, "PAY-"+strconv.FormatUint(n, 10), n) })
	}
	through := func(ib *inbox.Inbox[pgx.Tx]) func(n uint64) error {
		return func(n uint64) error {
			id := "PAY-" + strconv.FormatUint(n, 10)
			out, err := ib.Process(ctx, inbox.Event{Consumer: "credits", CorrelationID: id},
				func(ctx context.Context, tx pgx.Tx) error { return business(ctx, tx, id, n) })
			if err == nil && out != inbox.Processed {
				err = fmt.Errorf("outcome %v", out)
			}
			return err
		}
	}
	for _, parallel := range []bool{false, true} {
		name := "one-worker"
		if parallel {
			name = "8-per-cpu"
		}
		var with, withSeparate, without float64
		b.Run(name+"/without-inbox", func(b *testing.B) { without = each(b, parallel, bare) })
		b.Run(name+"/with-inbox", func(b *testing.B) { with = each(b, parallel, through(ib)) })
		b.Run(name+"/with-inbox-claim-separately", func(b *testing.B) { withSeparate = each(b, parallel, through(separate)) })
		if without > 0 && with > 0 && withSeparate > 0 {
			fmt.Printf("InboxOverhead %s: without inbox %.0f µs/msg, with inbox %.0f µs/msg (ratio %.2f, target ≤ 1.3), claim in a round trip of its own %.0f µs/msg (%.2f)\n",
				name, without/1e3, with/1e3, with/without, withSeparate/1e3, withSeparate/without)
		}
	}
}

// runEach runs op b.N times, each with the next number of seq: by one
// worker, or by 8 per CPU; it returns the time per operation.
func runEach(b *testing.B, parallel bool, seq *atomic.Uint64, op func(n uint64) error) float64 {
	if !parallel {
		for range b.N {
			if err := op(seq.Add(1)); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := op(seq.Add(1)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

// BenchmarkInboxOverheadMySQL is BenchmarkInboxOverhead on MariaDB (or the
// server of IDEM_MYSQL_URL) through database/sql: the business transaction
// with and without the inbox's claim, and their ratio (target: the inbox
// at least 0.7 of the bare transaction's rate, a ratio of time ≤ 1.43).
func BenchmarkInboxOverheadMySQL(b *testing.B) {
	db := testenv.OpenMySQL(b, testenv.MySQLDatabase(b, ""))
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	ctx := context.Background()
	for _, ddl := range []string{
		`CREATE TABLE credit_transfers (id bigint AUTO_INCREMENT PRIMARY KEY, correlation_id varchar(255) NOT NULL, account varchar(64) NOT NULL, amount_cents bigint NOT NULL)`,
		`CREATE TABLE accounts (account varchar(64) PRIMARY KEY, balance_cents bigint NOT NULL)`,
	} {
		if _, err := db.Exec(ddl); err != nil {
			b.Fatal(err)
		}
	}
	ib, err := inbox.New(databasesql.New(db, sqldriver.MySQL), inbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	business := func(ctx context.Context, tx *sql.Tx, id string, n uint64) error {
		acc := "ACC-" + strconv.FormatUint(n%100, 10)
		if _, err := tx.ExecContext(ctx, `INSERT INTO credit_transfers (correlation_id, account, amount_cents) VALUES (?, ?, 100)`, id, acc); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO accounts VALUES (?, 100) ON DUPLICATE KEY UPDATE balance_cents = balance_cents + 100`, acc)
		return err
	}
	var seq atomic.Uint64
	bare := func(n uint64) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := business(ctx, tx, "PAY-"+strconv.FormatUint(n, 10), n); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	through := func(n uint64) error {
		id := "PAY-" + strconv.FormatUint(n, 10)
		out, err := ib.Process(ctx, inbox.Event{Consumer: "credits", CorrelationID: id},
			func(ctx context.Context, tx *sql.Tx) error { return business(ctx, tx, id, n) })
		if err == nil && out != inbox.Processed {
			err = fmt.Errorf("outcome %v", out)
		}
		return err
	}
	for _, parallel := range []bool{false, true} {
		name := "one-worker"
		if parallel {
			name = "8-per-cpu"
		}
		var with, without float64
		b.Run(name+"/without-inbox", func(b *testing.B) { without = runEach(b, parallel, &seq, bare) })
		b.Run(name+"/with-inbox", func(b *testing.B) { with = runEach(b, parallel, &seq, through) })
		if without > 0 && with > 0 {
			fmt.Printf("InboxOverheadMySQL %s: without inbox %.0f µs/msg, with inbox %.0f µs/msg (the inbox at %.2f of the bare rate, target ≥ 0.7)\n",
				name, without/1e3, with/1e3, without/with)
		}
	}
}
