package watermillidem_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/brokertest"
	"github.com/idemgo/idem/broker/watermillidem"
	"github.com/idemgo/idem/internal/testenv"
)

// TestConformance runs the broker suite on Watermill's Go channel pub/sub
// with the router a user would build: Watermill's PoisonQueue middleware
// outside idem's (ErrRejected goes to the poison topic). A Go channel is
// one process, and a nacked message comes back at once: the suite's
// cross-process and retry-delay cases do not apply.
//
// Each topic has a Go channel of its own: a router stopped by cancelling
// its context may close its handler's subscriber (Watermill's router does
// when its own Close, which follows the handlers' end, wins the race with
// the cancellation), so a pub/sub shared by the cases was now and then
// closed under the next case's router, which then never ran (CI hung 20
// minutes in PoisonedAfterMaxAttempts).
func TestConformance(t *testing.T) {
	logger := watermill.NopLogger{}
	var pubsubs sync.Map // topic → *gochannel.GoChannel
	pubsub := func(topic string) *gochannel.GoChannel {
		ps, _ := pubsubs.Load(topic)
		return ps.(*gochannel.GoChannel)
	}
	brokertest.Run(t, brokertest.Harness{
		NewTopic: func(t testing.TB) string {
			topic := testenv.RandomName("idembroker.")
			ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, logger)
			t.Cleanup(func() { _ = ps.Close() })
			pubsubs.Store(topic, ps)
			return topic
		},
		Consume: func(t testing.TB, topic string, g *idem.Guard, policy broker.Policy, work brokertest.Work, events chan<- brokertest.Event) func() {
			ps := pubsub(topic)
			router, err := message.NewRouter(message.RouterConfig{}, logger)
			if err != nil {
				t.Fatal(err)
			}
			poison, err := middleware.PoisonQueueWithFilter(ps, topic+".poison", func(err error) bool { return errors.Is(err, watermillidem.ErrRejected) })
			if err != nil {
				t.Fatal(err)
			}
			// What the router does with the outcome, as a decision.
			observe := func(h message.HandlerFunc) message.HandlerFunc {
				return func(m *message.Message) ([]*message.Message, error) {
					out, err := h(m)
					e := brokertest.Event{Key: m.Metadata.Get(brokertest.KeyHeader)}
					switch {
					case err == nil:
						e.Verdict = broker.Ack
					case errors.Is(err, watermillidem.ErrRejected):
						e.Verdict, e.Reason = broker.DeadLetter, err.Error()
					default:
						e.Verdict, e.Reason = broker.Retry, err.Error()
					}
					events <- e
					return out, err
				}
			}
			idemMW, err := watermillidem.Middleware(g, brokertest.Scope, broker.HeaderKey(brokertest.KeyHeader))
			if err != nil {
				t.Fatal(err)
			}
			router.AddMiddleware(poison, observe, idemMW)
			router.AddConsumerHandler("credits", topic, ps, func(m *message.Message) error {
				return work(m.Context(), m.Metadata.Get(brokertest.KeyHeader), m.Payload)
			})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			var runErr error
			go func() { defer close(done); runErr = router.Run(ctx) }()
			select {
			case <-router.Running():
			case <-done:
				t.Fatalf("the router stopped before it ran: %v", runErr)
			}
			var once sync.Once
			stop := func() { once.Do(func() { cancel(); <-done }) }
			t.Cleanup(stop)
			return stop
		},
		Publish: func(t testing.TB, topic, key string, body []byte) {
			m := message.NewMessage(watermill.NewUUID(), body)
			if key != "" {
				m.Metadata.Set(brokertest.KeyHeader, key)
			}
			if err := pubsub(topic).Publish(topic, m); err != nil {
				t.Fatal(err)
			}
		},
	})
}
