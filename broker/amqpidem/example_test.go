package amqpidem_test

import (
	"context"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/store/sqlitestore"
)

// A RabbitMQ consumer whose work runs once per correlation_id, which opens
// its connection again after a broker restart or a network cut. Declare the
// queue durable and publish persistent messages with confirms
// (docs/durability.md). This example only compiles: it needs a RabbitMQ
// server.
func ExampleConsumeRedialing() {
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: "idem.db"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	guard, _ := idem.NewGuard(idem.Config{Store: store})
	h, err := amqpidem.GuardHandler(guard, amqpidem.Config{Scope: "credits", Key: broker.JSONKey("correlation_id"), Concurrency: 8},
		func(ctx context.Context, d *amqp.Delivery, fence uint64) ([]byte, error) {
			return nil, credit(ctx, d.Body) // your side effect
		})
	if err != nil {
		log.Fatal(err)
	}
	err = amqpidem.ConsumeRedialing(ctx, amqpidem.Redialing{
		URL: "amqp://guest:guest@127.0.0.1:5672/",
		Setup: func(ch *amqp.Channel) error {
			if _, err := ch.QueueDeclare("payments", true, false, false, false, nil); err != nil {
				return err
			}
			return ch.Qos(8, 0, false) // at least Concurrency
		},
		OnError: func(err error) { log.Printf("%v; connecting again", err) },
	}, "payments", "credits", h)
	if err != nil {
		log.Fatal(err)
	}
}

func credit(context.Context, []byte) error { return nil }
