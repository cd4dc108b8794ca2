package natsidem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/internal/testenv"
)

// TestInboxBatches consumes 300 intents, each published twice, through the
// batched inbox on PostgreSQL, with every 50th intent failing on its first
// run: each intent's business row is written exactly once, every copy is
// acked, a keyless message is dead-lettered, and messages really shared
// transactions.
func TestInboxBatches(t *testing.T) {
	ctx := context.Background()
	pool, schema, ib := testenv.PostgresInbox(t, func(schema string) string { return `CREATE TABLE ` + schema + `.credits (ref text NOT NULL)` })

	js, cons, name := stream(t)
	const intents = 300
	var mu sync.Mutex
	failed := map[string]bool{}
	txs := map[pgx.Tx]bool{}
	runs := 0
	acks, deadLetters := make(chan struct{}, 4*intents), make(chan string, 10)
	h, err := natsidem.InboxBatches(natsidem.Config{Scope: "credits", Key: broker.JSONKey("correlation_id"), Concurrency: 4,
		Policy: broker.Policy{BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
		OnDecision: func(_ jetstream.Msg, d broker.Decision) {
			switch d.Verdict {
			case broker.Ack:
				acks <- struct{}{}
			case broker.DeadLetter:
				deadLetters <- d.Reason
			}
		}},
		natsidem.Batch[pgx.Tx]{Inbox: ib, Size: 20, Process: func(ctx context.Context, tx pgx.Tx, msg jetstream.Msg) error {
			id, _ := broker.JSONKey("correlation_id")(msgView{msg})
			mu.Lock()
			runs++
			txs[tx] = true
			failFirst := id[len(id)-2:] == "00" || id[len(id)-2:] == "50"
			if failFirst && !failed[id] {
				failed[id] = true
				mu.Unlock()
				if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.credits VALUES ($1)`, id); err != nil {
					return err
				}
				return errors.New("ledger refused " + id) // rolled back to the savepoint
			}
			mu.Unlock()
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.credits VALUES ($1)`, id)
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h.Handle)
	if err != nil {
		t.Fatal(err)
	}
	for copy := range 2 {
		for i := range intents {
			publish(t, js, name+".in", fmt.Sprintf("b%d-%d", copy, i), fmt.Sprintf(`{"correlation_id":"PAY-%04d"}`, i))
		}
	}
	publish(t, js, name+".in", "keyless", `{"amount":1}`)
	deadline := time.After(60 * time.Second)
	for n := 0; n < 2*intents; n++ {
		select {
		case <-acks:
		case <-deadline:
			t.Fatalf("%d of %d copies acked", n, 2*intents)
		}
	}
	if reason := <-deadLetters; reason == "" {
		t.Fatal("the keyless message was not dead-lettered")
	}
	cc.Stop()
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
	if len(failed) != 6 {
		t.Fatalf("%d intents failed once, want 6", len(failed))
	}
	if len(txs) >= runs {
		t.Fatalf("%d runs in %d transactions: nothing was batched", runs, len(txs))
	}
	t.Logf("%d runs in %d transactions", runs, len(txs))
}

// msgView reads a JetStream message through the broker.Message view.
type msgView struct{ m jetstream.Msg }

func (v msgView) Header(name string) string { return v.m.Headers().Get(name) }
func (v msgView) Body() []byte              { return v.m.Data() }
