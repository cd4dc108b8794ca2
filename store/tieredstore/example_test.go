package tieredstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/redisstore"
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

// A hot tier on a Redis master with two replicas under Sentinel, over
// PostgreSQL. The hot tier's writes wait for both replicas (WaitReplicas),
// so a failover of the master loses no claim or settle it acknowledged,
// and the tiered store keeps its guarantees across it.
func Example_replicatedHotTier() {
	ctx := context.Background()
	sentinels := []string{"sentinel-1:26379", "sentinel-2:26379", "sentinel-3:26379"}
	hot, err := redisstore.New(redisstore.Config{
		Client:       redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "idem", SentinelAddrs: sentinels, MaxRetries: -1}),
		WaitReplicas: 2, // the master's two replicas
		CloseClient:  true,
	})
	if err != nil {
		log.Fatal(err)
	}
	cold, err := pgstore.Open(ctx, pgstore.Config{ConnString: "postgres://idem@db/idem"})
	if err != nil {
		log.Fatal(err)
	}
	store, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
}
