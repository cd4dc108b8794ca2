package redisstore_test

import (
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/redisstore"
)

// New takes a go-redis client of any topology (single, Sentinel, Cluster,
// Ring). This example only compiles: it needs a Redis server, with an
// append-only file fsynced on every write if the records must survive its
// crash (docs/durability.md).
func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "redis.internal:6379", MaxRetries: -1}) // the store retries nothing itself
	store, err := redisstore.New(redisstore.Config{Client: client, CloseClient: true})     // or storeurl.Open(ctx, "redis://…", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	guard, err := idem.NewGuard(idem.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	_ = guard // guard.Run, idem.Do…
}
