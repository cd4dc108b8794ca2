package amqpidem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/internal/testenv"
)

// TestInboxBatches consumes 200 intents, each published twice, through the
// batched inbox on PostgreSQL, every 40th failing on its first run (6 of them): each
// intent's row is written once, every copy acked, deliveries shared
// transactions.
func TestInboxBatches(t *testing.T) {
	ctx := context.Background()
	pool, schema, ib := testenv.PostgresInbox(t, func(schema string) string { return `CREATE TABLE ` + schema + `.credits (ref text NOT NULL)` })
	ch, consumeCh, q := queue(t)
	if err := consumeCh.Qos(200, 0, false); err != nil {
		t.Fatal(err)
	}
	const intents = 200
	var mu sync.Mutex
	failed := map[string]bool{}
	txs := map[pgx.Tx]bool{}
	runs := 0
	acks := make(chan struct{}, 4*intents)
	h, err := amqpidem.InboxBatches(amqpidem.Config{Scope: "credits", Key: amqpidem.CorrelationIDKey, Concurrency: 4,
		Policy: broker.Policy{BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
		OnDecision: func(_ *amqp.Delivery, d broker.Decision) {
			if d.Verdict == broker.Ack {
				acks <- struct{}{}
			}
		}},
		amqpidem.Batch[pgx.Tx]{Inbox: ib, Size: 20, Process: func(ctx context.Context, tx pgx.Tx, d *amqp.Delivery) error {
			id := d.CorrelationId
			mu.Lock()
			runs++
			txs[tx] = true
			first := id[len(id)-2:] == "00" || id[len(id)-2:] == "40" || id[len(id)-2:] == "80"
			failOnce := first && !failed[id]
			if failOnce {
				failed[id] = true
			}
			mu.Unlock()
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.credits VALUES ($1)`, id); err != nil {
				return err
			}
			if failOnce {
				return errors.New("ledger refused " + id)
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- amqpidem.Consume(cctx, consumeCh, q, "batch", h.Handle) }()
	for copy := range 2 {
		for i := range intents {
			publish(t, ch, q, fmt.Sprintf("b%d-%d", copy, i), fmt.Sprintf("PAY-%04d", i), "{}")
		}
	}
	deadline := time.After(60 * time.Second)
	for n := 0; n < 2*intents; n++ {
		select {
		case <-acks:
		case <-deadline:
			t.Fatalf("%d of %d copies acked", n, 2*intents)
		}
	}
	cancel()
	<-done
	h.Close()
	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT ref) FROM `+schema+`.credits`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != intents || distinct != intents {
		t.Fatalf("%d business rows for %d ids; want %d, each once", rows, distinct, intents)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failed) != 6 || len(txs) >= runs {
		t.Fatalf("%d intents failed once (want 6); %d runs in %d transactions", len(failed), runs, len(txs))
	}
}
