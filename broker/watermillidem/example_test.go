package watermillidem_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/watermillidem"
	"github.com/idemgo/idem/store/memstore"
)

// The middleware in front of a router's handler: a message published twice
// under one correlation_id — the producer's retry, with a new message UUID —
// is handled once. Watermill's in-memory Pub/Sub stands in for the broker.
func ExampleMiddleware() {
	store := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(idem.Config{Store: store})
	mw, err := watermillidem.Middleware(guard, "credits", broker.JSONKey("correlation_id"))
	if err != nil {
		panic(err)
	}
	// Publish returns once the handler's message was acked.
	pubsub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	router.AddMiddleware(mw)
	var handled atomic.Int32
	router.AddConsumerHandler("credit", "payments", pubsub, func(m *message.Message) error {
		handled.Add(1)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	for range 2 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"correlation_id":"PAY-1","cents":2500}`))
		if err := pubsub.Publish("payments", msg); err != nil {
			panic(err)
		}
	}
	fmt.Println("published twice, handled", handled.Load(), "time")
	// Output: published twice, handled 1 time
}
