package storeurl_test

import (
	"context"
	"fmt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/storeurl"
)

// A store named by a URL, as the idem command takes it: memory:,
// sqlite:PATH, postgres://… or redis://….
func ExampleOpen() {
	ctx := context.Background()
	store, err := storeurl.Open(ctx, "memory:", nil)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	guard, _ := idem.NewGuard(idem.Config{Store: store})
	res, err := guard.Run(ctx, idem.Key{Scope: "s", ID: "k"}, nil, func(context.Context, uint64) ([]byte, error) {
		return []byte("done"), nil
	})
	fmt.Println(res.Outcome, string(res.Value), err)
	// Output: acquired done <nil>
}
