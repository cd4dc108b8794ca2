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
func TestConformance(t *testing.T) {
	logger := watermill.NopLogger{}
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, logger)
	defer ps.Close()
	brokertest.Run(t, brokertest.Harness{
		NewTopic: func(t testing.TB) string { return testenv.RandomName("idembroker.") },
		Consume: func(t testing.TB, topic string, g *idem.Guard, policy broker.Policy, work brokertest.Work, events chan<- brokertest.Event) func() {
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
			go func() { defer close(done); _ = router.Run(ctx) }()
			<-router.Running()
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
			if err := ps.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
		},
	})
}
