package kafkaidem_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/brokertest"
	"github.com/idemgo/idem/broker/kafkaidem"
	"github.com/idemgo/idem/internal/testenv"
)

// TestConformance runs the broker suite on Kafka, one partition per topic:
// one consumer group per topic, shared by every consumer of the topic (in
// this process and in the crash test's child).
func TestConformance(t *testing.T) { brokertest.Run(t, harness(t, 1, 1)) }

// TestConformancePartitions: eight partitions, four records at once.
func TestConformancePartitions(t *testing.T) { brokertest.Run(t, harness(t, 8, 4)) }

// TestCampaign runs the broker fault campaign on Kafka: consumer processes
// killed and frozen (past the group's session timeout: their partitions are
// rebalanced to the others), eight partitions, two at once per consumer.
func TestCampaign(t *testing.T) {
	// A consumer group is slower to recover than a queue: a rebalance
	// waits for every member to join again, up to the rebalance timeout
	// (20 s) for a member frozen meanwhile, and kills and freezes every
	// second or so chain rebalances. The drain fails after two minutes
	// without a key completed.
	brokertest.Campaign(t, harness(t, 8, 2), brokertest.CampaignConfig{TestName: "TestCampaign", Stall: 2 * time.Minute})
}

// harness is the suite's view of Kafka and kafkaidem.
func harness(t *testing.T, partitions int32, concurrency int) brokertest.Harness {
	brokers := testenv.Kafka(t)
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	return brokertest.Harness{
		Features: brokertest.Features{RetryDelay: true, CrossProcess: true},
		NewTopic: func(t testing.TB) string { return testenv.KafkaTopic(t, brokers, "idembroker-", partitions) },
		Consume: func(t testing.TB, topic string, g *idem.Guard, policy broker.Policy, work brokertest.Work, events chan<- brokertest.Event) func() {
			c, err := kafkaidem.GuardConsumer(g, kafkaidem.Config{
				Scope: brokertest.Scope, Key: broker.HeaderKey(brokertest.KeyHeader), Policy: policy, Concurrency: concurrency,
				ClientOptions: append(testenv.KafkaGroupOptions(), kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("worker-"+topic), kgo.ClientID(fmt.Sprintf("pid-%d", os.Getpid())),
					kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
				OnDecision: func(rec *kgo.Record, d broker.Decision) {
					events <- brokertest.Event{Key: header(rec, brokertest.KeyHeader), Decision: d}
				},
			}, func(ctx context.Context, rec *kgo.Record, fence uint64) ([]byte, error) {
				return nil, work(ctx, header(rec, brokertest.KeyHeader), rec.Value)
			})
			if err != nil {
				t.Fatal(err)
			}
			return start(t, c)
		},
		Diagnose: func(t testing.TB, topic string) string {
			return testenv.KafkaGroupView(brokers, "worker-"+topic, topic)
		},
		Publish: func(t testing.TB, topic, key string, body []byte) {
			rec := &kgo.Record{Topic: topic, Key: []byte(key), Value: body}
			if key != "" {
				rec.Headers = []kgo.RecordHeader{{Key: brokertest.KeyHeader, Value: []byte(key)}}
			}
			if err := producer.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func header(rec *kgo.Record, name string) string {
	for _, h := range rec.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}
