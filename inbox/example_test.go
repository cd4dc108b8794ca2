package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
)

func ExampleInbox_Process() {
	dir, _ := os.MkdirTemp("", "inbox-example-")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "shop.db")+"?_txlock=immediate")
	defer db.Close()
	ctx := context.Background()
	db.Exec(`CREATE TABLE balances (account TEXT PRIMARY KEY, cents INTEGER)`)
	ib, _ := inbox.New(databasesql.New(db, sqldriver.SQLite), inbox.Config{})
	_ = ib.Migrate(ctx)

	credit := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO balances VALUES ('ACC-1', 2500)
			ON CONFLICT (account) DO UPDATE SET cents = cents + 2500`)
		return err
	}
	// The broker delivers the same instruction twice, with two broker ids.
	for range 2 {
		out, err := ib.Process(ctx, inbox.Event{Consumer: "credits", CorrelationID: "PAY-42"}, credit)
		fmt.Println(out, err)
	}
	var cents int
	db.QueryRow(`SELECT cents FROM balances WHERE account = 'ACC-1'`).Scan(&cents)
	fmt.Println("balance:", cents)
	// Output:
	// processed <nil>
	// duplicate <nil>
	// balance: 2500
}

// On MySQL or MariaDB through database/sql (go-sql-driver/mysql): the key
// and the business change commit in one transaction. This example only
// compiles: it needs a MySQL server (the tests run the same calls against
// MariaDB).
func ExampleInbox_Process_mysql() {
	ctx := context.Background()
	// parseTime and loc=UTC: the inbox's points in time are UTC datetimes.
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop?parseTime=true&loc=UTC")
	if err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(databasesql.New(db, sqldriver.MySQL), inbox.Config{ConsumerVersion: "credits/1"})
	if err != nil {
		log.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	out, err := ib.Process(ctx, inbox.Event{Consumer: "credits", CorrelationID: "PAY-42"},
		func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO balances (account, cents) VALUES (?, ?)
				ON DUPLICATE KEY UPDATE cents = cents + VALUES(cents)`, "ACC-1", 2500)
			return err
		})
	fmt.Println(out, err)
}
