package mysqlstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/mysqlstore"
)

// TestExample runs the guide's example against the test server: two
// stores on one database, as two processes would have, the second
// replaying what the first completed.
func TestExample(t *testing.T) {
	loc := testenv.MySQLDatabase(t, "") // mysql://root@127.0.0.1:3306/idemtest_…
	ctx := context.Background()
	key := idem.Key{Scope: "invoices", ID: "INV-7"}
	var got []string
	for process := 1; process <= 2; process++ {
		store, err := mysqlstore.Open(ctx, mysqlstore.Config{DSN: loc}) // or "app:secret@tcp(db.internal:3306)/app"
		if err != nil {
			t.Fatal(err)
		}
		guard, _ := idem.NewGuard(idem.Config{Store: store})
		res, err := guard.Run(ctx, key, nil, func(context.Context, uint64) ([]byte, error) {
			return []byte(fmt.Sprintf("sent by process %d", process)), nil
		})
		got = append(got, fmt.Sprint(res.Outcome, " ", string(res.Value), " ", err))
		store.Close()
	}
	if fmt.Sprint(got) != "[acquired sent by process 1 <nil> replayed sent by process 1 <nil>]" {
		t.Fatalf("got %q", got)
	}
}
