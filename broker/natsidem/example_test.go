package natsidem_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/store/sqlitestore"
)

// A JetStream consumer whose work runs once per correlation_id, however
// often the message is delivered: a duplicate is acked without running, a
// copy that comes while the first runs is retried later (NakWithDelay), a
// message without a key is terminated. This example only compiles: it
// needs a NATS server with JetStream.
func ExampleGuardHandler() {
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: "idem.db"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	guard, _ := idem.NewGuard(idem.Config{Store: store})
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.CreateOrUpdateConsumer(ctx, "PAYMENTS", jetstream.ConsumerConfig{Durable: "credits", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		log.Fatal(err)
	}
	h, err := natsidem.GuardHandler(guard, natsidem.Config{Scope: "credits", Key: broker.JSONKey("correlation_id")},
		func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error) {
			return nil, credit(ctx, msg.Data()) // your side effect
		})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := cons.Consume(h)
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
	select {}
}

func credit(context.Context, []byte) error { return nil }
