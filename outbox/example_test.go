package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// On PostgreSQL with pgx: the business change, the key and the message
// commit in one transaction. This example only compiles: it needs a
// PostgreSQL server (the tests run the same calls against one).
func ExampleOutbox_EnqueueTx_postgres() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	body := []byte(`{"order":4711,"sku":"A-1","qty":2}`)

	ob, err := outbox.New(pgxv5.New(pool), outbox.Config{}) // *outbox.Outbox[pgx.Tx]
	if err != nil {
		log.Fatal(err)
	}
	err = ob.Migrate(ctx) // idem_outbox, idem_outbox_counters
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // after a commit: nothing
	// … the business change, in tx …
	if _, err := tx.Exec(ctx, `UPDATE orders SET state = 'placed' WHERE id = 4711`); err != nil {
		log.Fatal(err)
	}
	key, err := ob.NextKeyTx(ctx, tx, "ORD", time.Now()) // ORD-20261129-0001, from a counter in tx
	if err != nil {
		log.Fatal(err)
	}
	err = ob.EnqueueTx(ctx, tx, outbox.Message{Key: key, Destination: "https://partner.example/orders", Payload: body})
	if err != nil {
		log.Fatal(err)
	}
	// An account's bookings go out one at a time, in order: they share an
	// ordering key.
	dest := "nats:bookings.acct-42"
	if key, err = outbox.NewUUIDKey(); err != nil {
		log.Fatal(err)
	}
	err = ob.EnqueueTx(ctx, tx, outbox.Message{Key: key, Destination: dest, Payload: body, OrderingKey: "acct-42"})
	if err != nil {
		log.Fatal(err)
	}
	err = tx.Commit(ctx) // the message and its key exist before the first send, or neither does
	if err != nil {
		log.Fatal(err)
	}
}

// On MySQL or MariaDB through database/sql (go-sql-driver/mysql): the
// business change, the key and the message commit in one transaction. This
// example only compiles: it needs a MySQL server (the tests run the same
// calls against MariaDB).
func ExampleOutbox_EnqueueTx_mysql() {
	ctx := context.Background()
	// parseTime and loc=UTC: the outbox's points in time are UTC datetimes.
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop?parseTime=true&loc=UTC")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	body := []byte(`{"order":4711,"sku":"A-1","qty":2}`)

	ob, err := outbox.New(databasesql.New(db, sqldriver.MySQL), outbox.Config{}) // *outbox.Outbox[*sql.Tx]
	if err != nil {
		log.Fatal(err)
	}
	err = ob.Migrate(ctx)
	if err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // after a commit: nothing
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET state = 'placed' WHERE id = ?`, 4711); err != nil {
		log.Fatal(err)
	}
	key, err := ob.NextKeyTx(ctx, tx, "ORD", time.Now())
	if err != nil {
		log.Fatal(err)
	}
	err = ob.EnqueueTx(ctx, tx, outbox.Message{Key: key, Destination: "https://partner.example/orders", Payload: body})
	if err != nil {
		log.Fatal(err)
	}
	err = tx.Commit()
	if err != nil {
		log.Fatal(err)
	}
}
