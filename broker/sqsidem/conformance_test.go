package sqsidem_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/brokertest"
	"github.com/idemgo/idem/broker/sqsidem"
	"github.com/idemgo/idem/internal/testenv"
)

// TestConformance runs the broker suite on a standard queue: redelivery
// after the visibility timeout, a retry's delay as the message's
// visibility, dead letters copied to a queue of their own.
func TestConformance(t *testing.T) { brokertest.Run(t, harness(t, false, 1)) }

// TestConformanceConcurrent: the same suite with 8 messages at once.
func TestConformanceConcurrent(t *testing.T) {
	skipShort(t)
	brokertest.Run(t, harness(t, false, 8))
}

// TestConformanceFIFO: the suite on a FIFO queue, every message in a
// group of its own.
func TestConformanceFIFO(t *testing.T) {
	skipShort(t)
	brokertest.Run(t, harness(t, true, 4))
}

// skipShort: under -short the suite runs once, on a standard queue (the
// other configurations run in .ci/run).
func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the suite runs once, on a standard queue")
	}
}

// harness is the suite's view of SQS and sqsidem: a queue per topic (and
// its dead-letter queue), consumers that share it in this process and in
// the crash test's child.
func harness(t *testing.T, fifo bool, concurrency int) brokertest.Harness {
	c := testenv.SQSClient(t)
	attrs := func() map[string]string {
		if fifo {
			return map[string]string{string(types.QueueAttributeNameFifoQueue): "true"}
		}
		return nil
	}
	return brokertest.Harness{
		Features: brokertest.Features{RetryDelay: true, CrossProcess: true},
		// A topic is the queue's URL and its dead-letter queue's, a space
		// between.
		NewTopic: func(t testing.TB) string {
			return testenv.SQSQueue(t, c, "idem-broker-", attrs()) + " " + testenv.SQSQueue(t, c, "idem-broker-dlq-", attrs())
		},
		Consume: func(t testing.TB, topic string, g *idem.Guard, policy broker.Policy, work brokertest.Work, events chan<- brokertest.Event) func() {
			url, dead, _ := strings.Cut(topic, " ")
			cons, err := sqsidem.GuardConsumer(g, sqsidem.Config{
				Client: c, QueueURL: url, Scope: brokertest.Scope, Key: broker.HeaderKey(brokertest.KeyHeader),
				Policy: policy, Concurrency: concurrency, VisibilityTimeout: 2 * time.Second, WaitTime: time.Second,
				DeadLetterQueueURL: dead,
				OnDecision: func(m *sqsidem.Message, d broker.Decision) {
					events <- brokertest.Event{Key: m.Header(brokertest.KeyHeader), Decision: d}
				},
			}, func(ctx context.Context, m *sqsidem.Message, fence uint64) ([]byte, error) {
				return nil, work(ctx, m.Header(brokertest.KeyHeader), m.Data)
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- cons.Run(ctx) }()
			var once sync.Once
			stop := func() {
				once.Do(func() {
					cancel()
					if err := <-done; err != nil {
						t.Error(err)
					}
				})
			}
			t.Cleanup(stop)
			return stop
		},
		Publish: func(t testing.TB, topic, key string, body []byte) {
			url, _, _ := strings.Cut(topic, " ")
			in := &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(string(body)), MessageAttributes: map[string]types.MessageAttributeValue{}}
			if key != "" {
				in.MessageAttributes[brokertest.KeyHeader] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(key)}
			}
			if fifo {
				in.MessageGroupId, in.MessageDeduplicationId = aws.String(testenv.RandomName("g-")), aws.String(testenv.RandomName("broker-id-"))
			}
			if _, err := c.SendMessage(context.Background(), in); err != nil {
				t.Fatal(err)
			}
		},
	}
}

// TestCampaign runs the broker fault campaign on a standard queue, four
// messages at once per consumer.
func TestCampaign(t *testing.T) {
	brokertest.Campaign(t, harness(t, false, 4), brokertest.CampaignConfig{TestName: "TestCampaign"})
}

// TestCampaignFIFO runs it on a FIFO queue.
func TestCampaignFIFO(t *testing.T) {
	brokertest.Campaign(t, harness(t, true, 4), brokertest.CampaignConfig{TestName: "TestCampaignFIFO"})
}
