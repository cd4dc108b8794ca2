package natsidem_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/brokertest"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/internal/testenv"
)

// TestConformance runs the broker suite on JetStream: a stream per topic,
// one durable pull consumer shared by every consumer of the topic (in
// this process and in the crash test's child), redelivery after AckWait.
func TestConformance(t *testing.T) { conformance(t, 1) }

// TestConformanceConcurrent: the same suite with 8 messages at once.
func TestConformanceConcurrent(t *testing.T) { conformance(t, 8) }

// TestCampaign runs the broker fault campaign on JetStream, four messages
// at once per consumer.
func TestCampaign(t *testing.T) {
	brokertest.Campaign(t, harness(t, 4), brokertest.CampaignConfig{TestName: "TestCampaign"})
}

// TestCampaignPostgres runs it over PostgreSQL, cut and stalled for the
// test's consumer and half the others.
func TestCampaignPostgres(t *testing.T) {
	brokertest.Campaign(t, harness(t, 4), brokertest.CampaignConfig{TestName: "TestCampaignPostgres", Postgres: true})
}

func conformance(t *testing.T, concurrency int) { brokertest.Run(t, harness(t, concurrency)) }

// harness is the suite's view of JetStream and natsidem.
func harness(t *testing.T, concurrency int) brokertest.Harness {
	nc, err := nats.Connect(testenv.NATSURL, nats.Timeout(3*time.Second))
	testenv.Need(t, "NATS", testenv.NATSURL, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return brokertest.Harness{
		Features: brokertest.Features{RetryDelay: true, CrossProcess: true},
		NewTopic: func(t testing.TB) string {
			ctx := context.Background()
			name := testenv.RandomName("IDEMBROKER_")
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
			if _, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
				Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second,
			}); err != nil {
				t.Fatal(err)
			}
			return name
		},
		Consume: func(t testing.TB, topic string, g *idem.Guard, policy broker.Policy, work brokertest.Work, events chan<- brokertest.Event) func() {
			cons, err := js.Consumer(context.Background(), topic, "worker")
			if err != nil {
				t.Fatal(err)
			}
			h, err := natsidem.GuardHandler(g, natsidem.Config{
				Scope: brokertest.Scope, Key: broker.HeaderKey(brokertest.KeyHeader), Policy: policy, Concurrency: concurrency,
				OnDecision: func(msg jetstream.Msg, d broker.Decision) {
					events <- brokertest.Event{Key: msg.Headers().Get(brokertest.KeyHeader), Decision: d}
				},
			}, func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error) {
				return nil, work(ctx, msg.Headers().Get(brokertest.KeyHeader), msg.Data())
			})
			if err != nil {
				t.Fatal(err)
			}
			cc, err := cons.Consume(h)
			if err != nil {
				t.Fatal(err)
			}
			var once sync.Once
			stop := func() { once.Do(cc.Stop) }
			t.Cleanup(stop)
			return stop
		},
		Publish: func(t testing.TB, topic, key string, body []byte) {
			m := nats.NewMsg(topic + ".in")
			m.Data = body
			if key != "" {
				m.Header.Set(brokertest.KeyHeader, key)
			}
			m.Header.Set(nats.MsgIdHdr, testenv.RandomName("broker-id-"))
			if _, err := js.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		},
	}
}
