package kafkaidem_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/kafkaidem"
	"github.com/idemgo/idem/store/sqlitestore"
)

// A consumer group whose work runs once per correlation_id: each
// partition's records are run in order, a record's offset is committed
// only once it settled, a record that cannot run is copied to
// payments.DLT. This example only compiles: it needs a Kafka cluster —
// go run ./examples/local-kafka serves one on 127.0.0.1:9092.
func ExampleGuardConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	store, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: "idem.db"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	guard, _ := idem.NewGuard(idem.Config{Store: store})
	c, err := kafkaidem.GuardConsumer(guard, kafkaidem.Config{
		Scope: "credits", Key: broker.JSONKey("correlation_id"), Concurrency: 4,
		ClientOptions: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:9092"), kgo.ConsumerGroup("credits"), kgo.ConsumeTopics("payments")},
	}, func(ctx context.Context, rec *kgo.Record, fence uint64) ([]byte, error) {
		return nil, credit(ctx, rec.Value) // your side effect
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // on SIGTERM: finishes the records in flight, commits, leaves
		log.Fatal(err)
	}
}

func credit(context.Context, []byte) error { return nil }
