package sqlitestore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/sqlitestore"
)

// A store in a file, shared by the processes of one machine: what one of
// them completed, another replays.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "idem")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	key := idem.Key{Scope: "invoices", ID: "INV-7"}
	for process := 1; process <= 2; process++ { // two processes, one after the other
		store, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(dir, "idem.db")}) // URL: sqlite:PATH
		if err != nil {
			panic(err)
		}
		guard, _ := idem.NewGuard(idem.Config{Store: store})
		res, err := guard.Run(ctx, key, nil, func(context.Context, uint64) ([]byte, error) {
			return []byte(fmt.Sprintf("sent by process %d", process)), nil
		})
		fmt.Println(res.Outcome, string(res.Value), err)
		store.Close()
	}
	// Output:
	// acquired sent by process 1 <nil>
	// replayed sent by process 1 <nil>
}
