package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

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
