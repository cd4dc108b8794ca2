package pgstore_test

import (
	"context"
	"log"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/pgstore"
)

// Open connects a pool of its own and creates or upgrades the tables. This
// example only compiles: it needs a PostgreSQL server.
func ExampleOpen() {
	ctx := context.Background()
	store, err := pgstore.Open(ctx, pgstore.Config{ConnString: "postgres://app@db.internal:5432/app?pool_max_conns=20"}) // or the URL
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
