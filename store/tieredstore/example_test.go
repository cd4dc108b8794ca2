package tieredstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/tieredstore"
)

// Claims in a fast store (Redis, in production), settled records kept for
// their whole retention in a durable one (PostgreSQL): here two memory
// stores stand in for them. A record gone from the hot store is replayed
// from the cold one.
func ExampleNew() {
	hot, cold := memstore.New(memstore.Config{}), memstore.New(memstore.Config{})
	defer hot.Close()
	defer cold.Close()
	store, err := tieredstore.New(tieredstore.Config{
		Hot:          hot,       // claims, leases, recent results: Redis, memory
		Cold:         cold,      // every settled record, for the long retention: PostgreSQL, SQLite
		HotRetention: time.Hour, // how long a settled record's hot copy lives
	})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	guard, _ := idem.NewGuard(idem.Config{Store: store})
	ctx := context.Background()
	key := idem.Key{Scope: "refunds", ID: "R-9"}
	run := func() {
		res, err := guard.Run(ctx, key, nil, func(context.Context, uint64) ([]byte, error) { return []byte("refunded"), nil })
		fmt.Println(res.Outcome, string(res.Value), err)
	}
	run()
	_ = hot.Delete(ctx, guard.StorageKey(key)) // the hot tier forgot it
	run()
	// Output:
	// acquired refunded <nil>
	// replayed refunded <nil>
}
