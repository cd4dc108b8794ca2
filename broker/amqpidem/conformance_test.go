package amqpidem_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/broker/brokertest"
	"github.com/idemgo/idem/internal/testenv"
)

func dial(t testing.TB) *amqp.Connection {
	conn, err := amqp.DialConfig(testenv.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	testenv.Need(t, "RabbitMQ", testenv.AMQPURL, err)
	return conn
}

// TestConformance runs the broker suite on RabbitMQ: a queue per topic
// (dead-lettering into topic.dead), every consumer on its own connection
// and channel (prefetch 1), so a killed consumer's unacked delivery is
// requeued to another.
func TestConformance(t *testing.T) { conformance(t, 1) }

// TestConformanceConcurrent: the same suite with 8 deliveries at once.
func TestConformanceConcurrent(t *testing.T) { conformance(t, 8) }

// TestCampaign runs the broker fault campaign on RabbitMQ, four deliveries
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

// harness is the suite's view of RabbitMQ and amqpidem.
func harness(t *testing.T, concurrency int) brokertest.Harness {
	admin := dial(t)
	t.Cleanup(func() { admin.Close() })
	pub, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return brokertest.Harness{
		Features: brokertest.Features{RetryDelay: true, CrossProcess: true},
		NewTopic: func(t testing.TB) string {
			name := testenv.RandomName("idembroker.")
			if _, err := pub.QueueDeclare(name+".dead", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := pub.QueueDeclare(name, false, false, false, false, amqp.Table{
				"x-dead-letter-exchange": "", "x-dead-letter-routing-key": name + ".dead",
			}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_, _ = pub.QueueDelete(name, false, false, false)
				_, _ = pub.QueueDelete(name+".dead", false, false, false)
			})
			return name
		},
		Consume: func(t testing.TB, topic string, g *idem.Guard, policy broker.Policy, work brokertest.Work, events chan<- brokertest.Event) func() {
			conn := dial(t)
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if err := ch.Qos(concurrency, 0, false); err != nil {
				t.Fatal(err)
			}
			key := func(d *amqp.Delivery) string { s, _ := d.Headers[brokertest.KeyHeader].(string); return s }
			h, err := amqpidem.GuardHandler(g, amqpidem.Config{
				Scope: brokertest.Scope, Key: broker.HeaderKey(brokertest.KeyHeader), Policy: policy, Concurrency: concurrency,
				OnDecision: func(d *amqp.Delivery, dec broker.Decision) {
					events <- brokertest.Event{Key: key(d), Decision: dec}
				},
			}, func(ctx context.Context, d *amqp.Delivery, fence uint64) ([]byte, error) {
				return nil, work(ctx, key(d), d.Body)
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = amqpidem.Consume(ctx, ch, topic, "", h)
			}()
			var once sync.Once
			stop := func() {
				once.Do(func() {
					cancel()
					<-done
					conn.Close()
				})
			}
			t.Cleanup(stop)
			return stop
		},
		Diagnose: func(t testing.TB, topic string) string { return testenv.RabbitMQQueueView(testenv.AMQPURL, topic) },
		Publish: func(t testing.TB, topic, key string, body []byte) {
			headers := amqp.Table{}
			if key != "" {
				headers[brokertest.KeyHeader] = key
			}
			if err := pub.PublishWithContext(context.Background(), "", topic, false, false, amqp.Publishing{
				MessageId: testenv.RandomName("broker-id-"), Headers: headers, Body: body,
			}); err != nil {
				t.Fatal(err)
			}
		},
	}
}
