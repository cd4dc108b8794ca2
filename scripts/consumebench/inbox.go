package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// benchInbox compares, on JetStream and PostgreSQL at 8 at once, the
// payments consumer's business transaction (insert the transfer, add to the
// account's balance; 10,000 accounts) run per message without the inbox,
// with the per-message inbox (InboxHandler + Process), and with the batched
// inbox (InboxBatches: up to 50 messages per transaction).
func benchInbox(ctx context.Context, js jetstream.JetStream, n int, url string) {
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=16")
	check(err)
	defer pool.Close()
	schema := "consumebench_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err = pool.Exec(ctx, `CREATE SCHEMA `+schema+`;
		CREATE TABLE `+schema+`.credit_transfers (id bigserial PRIMARY KEY, correlation_id text NOT NULL, account text NOT NULL, amount_cents bigint NOT NULL);
		CREATE TABLE `+schema+`.accounts (account text PRIMARY KEY, balance_cents bigint NOT NULL)`)
	check(err)
	defer pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
	ib, err := inbox.New(pgxv5.New(pool), inbox.Config{Table: schema + ".processed_events", VersionTable: schema + ".entity_versions"})
	check(err)
	check(ib.Migrate(ctx))

	type instruction struct {
		CorrelationID string `json:"correlation_id"`
		Account       string `json:"account"`
		AmountCents   int64  `json:"amount_cents"`
	}
	business := func(ctx context.Context, tx pgx.Tx, body []byte) error {
		var in instruction
		if err := json.Unmarshal(body, &in); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.credit_transfers (correlation_id, account, amount_cents) VALUES ($1, $2, $3)`,
			in.CorrelationID, in.Account, in.AmountCents); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.accounts VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET balance_cents = accounts.balance_cents + EXCLUDED.balance_cents`, in.Account, in.AmountCents)
		return err
	}
	const workers = 8
	cfg := func(done func()) natsidem.Config {
		return natsidem.Config{Scope: "payments", Key: broker.JSONKey("correlation_id"), Concurrency: workers,
			OnDecision: func(_ jetstream.Msg, d broker.Decision) {
				if d.Verdict != broker.Ack {
					panic(fmt.Sprintf("decision %v", d))
				}
				done()
			}}
	}
	bare := runJS(ctx, js, n, "txbare", func(done func()) (jetstream.MessageHandler, func()) {
		slots := make(chan struct{}, workers)
		return func(msg jetstream.Msg) {
			slots <- struct{}{}
			go func() {
				defer func() { <-slots }()
				check(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return business(ctx, tx, msg.Data()) }))
				_ = msg.Ack()
				done()
			}()
		}, func() {}
	})
	// The same handler path (natsidem.InboxHandler, 8 at once) with the
	// business transaction alone: what the inbox's own row costs is the
	// difference between this run and the next.
	handlerOnly := runJS(ctx, js, n, "txhandler", func(done func()) (jetstream.MessageHandler, func()) {
		h, err := natsidem.InboxHandler(cfg(done), func(ctx context.Context, msg jetstream.Msg, id string) (inbox.Outcome, error) {
			return inbox.Processed, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return business(ctx, tx, msg.Data()) })
		})
		check(err)
		return h, func() {}
	})
	perMessage := runJS(ctx, js, n, "txinbox", func(done func()) (jetstream.MessageHandler, func()) {
		h, err := natsidem.InboxHandler(cfg(done), func(ctx context.Context, msg jetstream.Msg, id string) (inbox.Outcome, error) {
			return ib.Process(ctx, inbox.Event{Consumer: "payments", CorrelationID: id}, func(ctx context.Context, tx pgx.Tx) error {
				return business(ctx, tx, msg.Data())
			})
		})
		check(err)
		return h, func() {}
	})
	batched := runJS(ctx, js, n, "txbatch", func(done func()) (jetstream.MessageHandler, func()) {
		h, err := natsidem.InboxBatches(cfg(done), natsidem.Batch[pgx.Tx]{Inbox: ib, Size: 50,
			Process: func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error { return business(ctx, tx, msg.Data()) }})
		check(err)
		return h.Handle, h.Close
	})
	fmt.Printf("== %d payments on JetStream into PostgreSQL, 8 at once\n", n)
	fmt.Printf("%-62s %8.0f msg/s  1.00\n", "business transaction per message, no inbox", bare)
	fmt.Printf("  %s\n", cpu["txbare"])
	fmt.Printf("%-62s %8.0f msg/s  %.2f of it\n", "the same through InboxHandler, no inbox row", handlerOnly, handlerOnly/bare)
	fmt.Printf("  %s\n", cpu["txhandler"])
	fmt.Printf("%-62s %8.0f msg/s  %.2f of it (target ≥ 0.85)\n", "inbox per message (InboxHandler + Process)", perMessage, perMessage/bare)
	fmt.Printf("  %s\n", cpu["txinbox"])
	fmt.Printf("%-62s %8.0f msg/s  %.2f of it (target ≥ 2)\n", "batched inbox (InboxBatches, up to 50 per transaction)", batched, batched/bare)
	fmt.Printf("  %s\n", cpu["txbatch"])
}
