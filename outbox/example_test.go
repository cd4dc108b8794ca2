package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
)

func ExampleOutbox_EnqueueTx() {
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_txlock=immediate")
	defer db.Close()
	ctx := context.Background()
	ob, _ := outbox.New(databasesql.New(db, sqldriver.SQLite), outbox.Config{})
	_ = ob.Migrate(ctx)

	// The business change and the intent to send, in one transaction.
	tx, _ := db.BeginTx(ctx, nil)
	key, _ := ob.NextKeyTx(ctx, tx, "ORD", time.Date(2026, 5, 14, 9, 0, 0, 0, time.UTC))
	_ = ob.EnqueueTx(ctx, tx, outbox.Message{Key: key, Destination: "demo://partner", Payload: []byte(`{"sku":"A-1"}`)})
	_ = tx.Commit()

	// A sender that fails once, then succeeds: the key is the same both times.
	attempts := 0
	send := outbox.SenderFunc(func(ctx context.Context, m *outbox.Message) outbox.Result {
		attempts++
		fmt.Printf("attempt %d: %s %s\n", attempts, m.Key, m.Payload)
		if attempts == 1 {
			return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("connection reset")}
		}
		return outbox.Result{Status: outbox.Acked}
	})
	relay, _ := outbox.NewRelay(outbox.RelayConfig{Store: ob.Store, Sender: outbox.Router{"demo": send}, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
	for attempts < 2 {
		relay.RunOnce(ctx)
		time.Sleep(5 * time.Millisecond)
	}
	row, _ := ob.Get(ctx, key)
	fmt.Println(row.Status, row.Tries)
	// Output:
	// attempt 1: ORD-20260514-0001 {"sku":"A-1"}
	// attempt 2: ORD-20260514-0001 {"sku":"A-1"}
	// acked 2
}
