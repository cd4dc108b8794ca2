package e2e_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/broker/kafkaidem"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/broker/sqsidem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/amqpsender"
	"github.com/idemgo/idem/outbox/kafkasender"
	"github.com/idemgo/idem/outbox/natssender"
	"github.com/idemgo/idem/outbox/sqssender"
)

// TestCampaignNATS runs the end-to-end campaign through JetStream, on a
// nats-server of its own that it crashes now and then: the relays publish
// with the key in Nats-Msg-Id (on a stream whose duplicate window is
// shorter than the relays' lease), the consumers take it from there
// through natsidem's InboxHandler and InboxBatches.
func TestCampaignNATS(t *testing.T) { campaign(t, "TestCampaignNATS", natsTransport()) }

// TestCampaignNATSMariaDB runs the JetStream campaign with the books — the
// debits and the outbox, the credits and the inbox — on a MariaDB server of
// its own, through database/sql: cut, stalled, and killed with SIGKILL and
// started again on its files, as PostgreSQL is in the others.
func TestCampaignNATSMariaDB(t *testing.T) {
	campaignOn(t, "TestCampaignNATSMariaDB", natsTransport(), mariaDBBooks)
}

// TestCampaignRabbitMQ runs it through RabbitMQ: the relays publish with
// confirms and the key in the message-id (no dedup at the broker: every
// copy reaches the queue), the consumers take it from there
// (amqpidem.MessageIDKey) through amqpidem's InboxHandler and
// InboxBatches.
func TestCampaignRabbitMQ(t *testing.T) { campaign(t, "TestCampaignRabbitMQ", amqpTransport()) }

// TestCampaignKafka runs it through Kafka — a kfake cluster in a process
// of its own, killed with SIGKILL and started again on its files: the
// relays produce every message twice (the idempotent producer keeps both:
// they are two sends), with the key in the Idempotency-Key header, to a
// topic of eight partitions; the consumers take it from there through
// kafkaidem's InboxConsumer, in one consumer group whose members the
// campaign kills and freezes past their session timeout, so partitions move
// between them all the time. A proxy stands only in front of the relays'
// first connection: Kafka clients then connect to the address the broker
// advertises.
func TestCampaignKafka(t *testing.T) {
	testenv.ServeKafka(t)
	campaign(t, "TestCampaignKafka", kafkaTransport())
}

// The consumers' policy: transient failures (a cut database) come back
// soon; a key in progress elsewhere does not occur with the inbox.
var policy = broker.Policy{InProgressDelay: 200 * time.Millisecond, BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second}

// How a consumer process takes its messages: consumersAtOnce at once, one
// per transaction, or (the batch consumers) consumersAtOnce transactions of
// up to batchSize messages each.
const (
	consumersAtOnce = 4
	batchSize       = 16
)

func jetStream(t testing.TB, url string) jetstream.JetStream {
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second), nats.MaxReconnects(-1))
	testenv.Need(t, "NATS", url, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func natsTransport() transport {
	return transport{
		broker: func(t testing.TB) (string, func() error) {
			srv := testenv.StartNATSServer(t)
			return srv.URL, srv.Restart
		},
		remove: func(url, topic string) {
			if nc, err := nats.Connect(url); err == nil {
				if js, err := jetstream.New(nc); err == nil {
					_ = js.DeleteStream(context.Background(), topic)
				}
				nc.Close()
			}
		},
		destination: func(url, topic string) string { return strings.TrimSuffix(url, "/") + "/" + topic },
		sender:      func() outbox.Sender { return natssender.New() },
		consume: func(t testing.TB, url, topic string, r receiver) {
			js, ctx := jetStream(t, url), context.Background()
			if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: topic, Subjects: []string{topic}, Duplicates: dedupWindow}); err != nil {
				t.Fatal(err)
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, topic, jetstream.ConsumerConfig{
				Durable: "credits", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: 256,
			})
			if err != nil {
				t.Fatal(err)
			}
			cfg := natsidem.Config{
				Scope: inboxConsumer, Key: broker.HeaderKey(nats.MsgIdHdr), Policy: policy,
				ProgressInterval: ackWait / 3, Concurrency: consumersAtOnce,
				OnDecision: func(msg jetstream.Msg, d broker.Decision) { r.decided(msg.Headers().Get(nats.MsgIdHdr), d) },
			}
			var handle jetstream.MessageHandler
			if r.batched() {
				h, err := r.natsBatches(cfg)
				if err != nil {
					t.Fatal(err)
				}
				handle = h
			} else {
				h, err := natsidem.InboxHandler(cfg, func(ctx context.Context, msg jetstream.Msg, key string) (inbox.Outcome, error) {
					return r.book(ctx, key, msg.Data())
				})
				if err != nil {
					t.Fatal(err)
				}
				handle = h
			}
			cc, err := cons.Consume(handle)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cc.Stop)
		},
	}
}

// kafkaPartitions is how many partitions the campaign's topic has.
const kafkaPartitions = 8

func kafkaTransport() transport {
	brokers := func(url string) []string { return []string{strings.TrimPrefix(url, "kafka://")} }
	return transport{
		broker: func(t testing.TB) (string, func() error) {
			if real := testenv.KafkaBrokers(); real != nil {
				return "kafka://" + real[0], nil // IDEM_KAFKA_BROKERS': not the test's to kill
			}
			srv := testenv.StartKafkaServer(t, "TestCampaignKafka")
			return "kafka://" + srv.Addr, srv.Restart
		},
		remove: func(url, topic string) {
			if cl, err := kgo.NewClient(kgo.SeedBrokers(brokers(url)...)); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _ = kadm.NewClient(cl).DeleteTopics(ctx, topic, topic+".DLT")
				cancel()
				cl.Close()
			}
		},
		destination: func(url, topic string) string { return url + "/" + topic },
		sender:      func() outbox.Sender { return twice{kafkasender.New(kafkasender.Config{})} },
		ordered:     true, // the ordering key is the record key: one partition per account
		consume: func(t testing.TB, url, topic string, r receiver) {
			adm := testenv.KafkaAdmin(t, brokers(url))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, name := range []string{topic, topic + ".DLT"} {
				resp, err := adm.CreateTopic(ctx, kafkaPartitions, 1, nil, name)
				if err == nil {
					err = resp.Err
				}
				if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
					t.Fatalf("creating %s: %v", name, err)
				}
			}
			c, err := kafkaidem.InboxConsumer(kafkaidem.Config{
				Scope: inboxConsumer, Policy: policy, Concurrency: consumersAtOnce,
				ClientOptions: append(testenv.KafkaGroupOptions(), kgo.SeedBrokers(brokers(url)...), kgo.ConsumerGroup("credits"),
					kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
				OnDecision: func(rec *kgo.Record, d broker.Decision) { r.decided(kafkaKey(rec), d) },
			}, func(ctx context.Context, rec *kgo.Record, key string) (inbox.Outcome, error) {
				return r.book(ctx, key, rec.Value)
			})
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = c.Run(context.Background()) }()
		},
	}
}

func kafkaKey(rec *kgo.Record) string {
	for _, h := range rec.Headers {
		if h.Key == kafkaidem.KeyHeader {
			return string(h.Value)
		}
	}
	return ""
}

// twice sends every message twice: a producer that retries whatever
// happened (or a relay whose acknowledgement was lost).
type twice struct{ outbox.Sender }

func (s twice) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	s.Sender.Send(ctx, m)
	return s.Sender.Send(ctx, m)
}

func amqpTransport() transport {
	return transport{
		broker: func(t testing.TB) (string, func() error) {
			srv := testenv.StartRabbitMQ(t)
			return srv.URL, srv.Restart
		},
		remove: func(url, topic string) {
			if conn, err := amqp.Dial(url); err == nil {
				if ch, err := conn.Channel(); err == nil {
					_, _ = ch.QueueDelete(topic, false, false, false)
				}
				conn.Close()
			}
		},
		destination: func(url, topic string) string { return url + "?routing_key=" + topic },
		sender:      func() outbox.Sender { return amqpsender.New(amqp.Config{}) },
		depth: func(url, topic string) (int, int, error) {
			conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(time.Second)})
			if err != nil {
				return 0, 0, err
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return 0, 0, err
			}
			q, err := ch.QueueDeclarePassive(topic, true, false, false, false, nil)
			return q.Messages, q.Consumers, err
		},
		consume: func(t testing.TB, url, topic string, r receiver) {
			cfg := amqpidem.Config{
				Scope: inboxConsumer, Key: amqpidem.MessageIDKey, Policy: policy, Concurrency: consumersAtOnce,
				OnDecision: func(d *amqp.Delivery, dec broker.Decision) { r.decided(d.MessageId, dec) },
			}
			var handle func(amqp.Delivery)
			if r.batched() {
				h, err := r.amqpBatches(cfg)
				if err != nil {
					t.Fatal(err)
				}
				handle = h
			} else {
				h, err := amqpidem.InboxHandler(cfg, func(ctx context.Context, d *amqp.Delivery, key string) (inbox.Outcome, error) {
					return r.book(ctx, key, d.Body)
				})
				if err != nil {
					t.Fatal(err)
				}
				handle = h
			}
			// The broker may crash: the consumer opens its connection again
			// (amqp091-go does not), declares its queue and goes on.
			go func() {
				_ = amqpidem.ConsumeRedialing(context.Background(), amqpidem.Redialing{URL: url,
					Setup: func(ch *amqp.Channel) error {
						if _, err := ch.QueueDeclare(topic, true, false, false, false, nil); err != nil {
							return err
						}
						return ch.Qos(batchSize*consumersAtOnce, 0, false)
					},
					PauseMax: time.Second,
				}, topic, "", handle)
			}()
		},
	}
}

// TestCampaignSQS runs it through Amazon SQS (fauxqs, or the SQS that
// IDEM_SQS_ENDPOINT names): the relays send with the key in the
// Idempotency-Key attribute (a standard queue keeps every copy), the odd
// ones through a proxy that cuts and stalls them; the consumers take it
// from there through sqsidem's InboxConsumer. The emulator keeps its
// queues in memory: it is not killed.
func TestCampaignSQS(t *testing.T) { campaign(t, "TestCampaignSQS", sqsTransport(false)) }

// TestCampaignSQSFIFO runs it through a FIFO queue: the key is also the
// MessageDeduplicationId and each account's transfers one message group,
// so the campaign checks they are booked in the order they committed.
func TestCampaignSQSFIFO(t *testing.T) { campaign(t, "TestCampaignSQSFIFO", sqsTransport(true)) }

// sqsClient is a client of the SQS at endpoint (http://HOST:PORT), with
// the region and credentials of the standard configuration (which
// testenv.SQS set in the environment).
func sqsClient(endpoint string) *sqs.Client {
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		cfg = aws.Config{Region: "us-east-1"} // the emulator takes any: the calls will say what is wrong
	}
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(endpoint) })
}

func sqsTransport(fifo bool) transport {
	name := func(topic string) string {
		if fifo {
			return topic + ".fifo"
		}
		return topic
	}
	create := func(c *sqs.Client, name string) (string, error) {
		in := &sqs.CreateQueueInput{QueueName: aws.String(name)}
		if fifo {
			in.Attributes = map[string]string{string(sqstypes.QueueAttributeNameFifoQueue): "true"}
		}
		out, err := c.CreateQueue(context.Background(), in)
		if err != nil {
			return "", err
		}
		return *out.QueueUrl, nil
	}
	return transport{
		broker: func(t testing.TB) (string, func() error) { return testenv.SQS(t), nil },
		remove: func(url, topic string) {
			c := sqsClient(url)
			for _, n := range []string{name(topic), name(topic + "-dlq")} {
				if out, err := c.GetQueueUrl(context.Background(), &sqs.GetQueueUrlInput{QueueName: aws.String(n)}); err == nil {
					_, _ = c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
				}
			}
		},
		destination: func(_, topic string) string { return "sqs://" + name(topic) },
		sender: func() outbox.Sender {
			// This relay's way to SQS: the proxy, for the odd ones.
			return sqssender.New(sqssender.Config{Client: sqsClient("http://" + os.Getenv(envBroker))})
		},
		consume: func(t testing.TB, url, topic string, r receiver) {
			c := sqsClient(url)
			queueURL, err := create(c, name(topic))
			if err != nil {
				t.Fatal(err)
			}
			dlqURL, err := create(c, name(topic+"-dlq"))
			if err != nil {
				t.Fatal(err)
			}
			cons, err := sqsidem.InboxConsumer(sqsidem.Config{
				Client: c, QueueURL: queueURL, DeadLetterQueueURL: dlqURL, Scope: inboxConsumer, Policy: policy,
				Key: broker.HeaderKey(sqssender.KeyAttribute), Concurrency: consumersAtOnce,
				VisibilityTimeout: ackWait, WaitTime: time.Second,
				OnDecision: func(m *sqsidem.Message, d broker.Decision) { r.decided(m.Header(sqssender.KeyAttribute), d) },
			}, func(ctx context.Context, m *sqsidem.Message, key string) (inbox.Outcome, error) {
				return r.book(ctx, key, m.Data)
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() { _ = cons.Run(ctx) }()
			t.Cleanup(cancel)
		},
		ordered: fifo,
	}
}
