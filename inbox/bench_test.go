package inbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
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
	// each runs op b.N times: by one worker, or by 8 per CPU.
	each := func(b *testing.B, parallel bool, op func(n uint64) error) float64 {
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
