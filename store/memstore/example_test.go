package memstore_test

import (
	"context"
	"fmt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/memstore"
)

// A store in the process, for tests and for one process that may forget
// its records when it exits.
func ExampleNew() {
	store := memstore.New(memstore.Config{}) // URL: memory:
	defer store.Close()
	guard, err := idem.NewGuard(idem.Config{Store: store})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	key := idem.Key{Scope: "emails", ID: "welcome-42"}
	sent := 0
	for range 2 {
		res, err := guard.Run(ctx, key, nil, func(context.Context, uint64) ([]byte, error) {
			sent++
			return []byte("queued"), nil
		})
		fmt.Println(res.Outcome, string(res.Value), err)
	}
	fmt.Println("emails sent:", sent)
	// Output:
	// acquired queued <nil>
	// replayed queued <nil>
	// emails sent: 1
}
