package sqssender_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/sendertest"
	"github.com/idemgo/idem/outbox/sqssender"
)

// TestConformance: the receiver is a standard queue, which keeps every
// copy of a resent message.
func TestConformance(t *testing.T) { conformance(t, false) }

// TestConformanceFIFO: the receiver is a FIFO queue, whose deduplication
// (MessageDeduplicationId = the key) keeps one copy of a resent message.
func TestConformanceFIFO(t *testing.T) { conformance(t, true) }

func conformance(t *testing.T, fifo bool) {
	c := testenv.SQSClient(t)
	s := sqssender.New(sqssender.Config{})
	sendertest.Run(t, sendertest.Target{
		Sender:   s,
		Features: sendertest.Features{ReceiverDedups: fifo},
		Destination: func(t *testing.T) (string, func() []sendertest.Delivery) {
			url := queue(t, c, fifo)
			return "sqs://" + url[strings.LastIndex(url, "/")+1:], drain(t, c, url)
		},
		KeyField: func(key string) string { return key },
		Unreachable: func(*testing.T) string {
			return "sqs://idem-no-such-queue" // delivered once someone creates it
		},
		Refused: func(*testing.T) []string {
			return []string{"sqs://", "sqs://with space", "sqs://a/b", "sqs://q?region=x", "https://sqs.example/q", "sqs://" + strings.Repeat("q", 81)}
		},
	})
}

func queue(t *testing.T, c *sqs.Client, fifo bool) string {
	var attrs map[string]string
	if fifo {
		attrs = map[string]string{string(types.QueueAttributeNameFifoQueue): "true"}
	}
	return testenv.SQSQueue(t, c, "idem-send-", attrs)
}

// drain returns what url's queue has received so far, reading (and
// deleting) what came since the last call; a payload sent as base64 is
// decoded, as sqsidem does.
func drain(t *testing.T, c *sqs.Client, url string) func() []sendertest.Delivery {
	var mu sync.Mutex
	var got []sendertest.Delivery
	return func() []sendertest.Delivery {
		mu.Lock()
		defer mu.Unlock()
		for {
			out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url),
				MaxNumberOfMessages: 10, MessageAttributeNames: []string{"All"}, VisibilityTimeout: 60})
			if err != nil {
				t.Fatal(err)
			}
			if len(out.Messages) == 0 {
				return append([]sendertest.Delivery(nil), got...)
			}
			for _, m := range out.Messages {
				body := []byte(*m.Body)
				if a, ok := m.MessageAttributes[sqssender.EncodingAttribute]; ok && *a.StringValue == "base64" {
					if body, err = base64.StdEncoding.DecodeString(*m.Body); err != nil {
						t.Fatal(err)
					}
				}
				got = append(got, sendertest.Delivery{KeyField: *m.MessageAttributes[sqssender.KeyAttribute].StringValue, Payload: body})
				if _, err := c.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// TestEndpointUnreachable: an SQS that does not answer leaves the row
// pending, with the cause.
func TestEndpointUnreachable(t *testing.T) {
	testenv.SQS(t)
	c := sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://127.0.0.1:1"), RetryMaxAttempts: 1})
	s := sqssender.New(sqssender.Config{Client: c})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := s.Send(ctx, &outbox.Message{Key: "K-1", Destination: "sqs://orders", Payload: []byte("x")})
	if res.Status != outbox.Pending || res.Err == nil {
		t.Fatalf("%s (%v), want pending with the cause", res.Status, res.Err)
	}
}

// TestRefusedMessagesAreDead: what SQS cannot take — an empty body, more
// attributes than it allows, a header whose name or value cannot be an
// attribute, a body over the queue's maximum size — is dead at once, with
// the reason; the queue receives nothing.
func TestRefusedMessagesAreDead(t *testing.T) {
	c := testenv.SQSClient(t)
	url := testenv.SQSQueue(t, c, "idem-send-", map[string]string{string(types.QueueAttributeNameMaximumMessageSize): "1024"})
	dest := "sqs://" + url[strings.LastIndex(url, "/")+1:]
	many := map[string]string{}
	for _, k := range strings.Fields("a b c d e f g h i j") {
		many["h-"+k] = "v"
	}
	s := sqssender.New(sqssender.Config{})
	for name, m := range map[string]*outbox.Message{
		"empty body":          {Key: "K-1", Destination: dest},
		"eleven attributes":   {Key: "K-2", Destination: dest, Payload: []byte("x"), Headers: many},
		"a header's name":     {Key: "K-3", Destination: dest, Payload: []byte("x"), Headers: map[string]string{"AWS.Trace": "1"}},
		"a header's value":    {Key: "K-5", Destination: dest, Payload: []byte("x"), Headers: map[string]string{"X-Note": "bell\x07"}},
		"over the queue size": {Key: "K-4", Destination: dest, Payload: []byte(strings.Repeat("x", 2048))},
	} {
		if res := s.Send(context.Background(), m); res.Status != outbox.Dead || res.Err == nil {
			t.Errorf("%s: %s (%v), want dead with the reason", name, res.Status, res.Err)
		}
	}
	if got := drain(t, c, url)(); len(got) != 0 {
		t.Fatalf("the queue received %d messages", len(got))
	}
}

// TestFIFOGroupsByOrderingKey: on a FIFO queue the ordering key is the
// message group, the key the deduplication id (hashed where it does not
// fit SQS's 128 characters).
func TestFIFOGroupsByOrderingKey(t *testing.T) {
	c := testenv.SQSClient(t)
	url := queue(t, c, true)
	dest := "sqs://" + url[strings.LastIndex(url, "/")+1:]
	s := sqssender.New(sqssender.Config{})
	long := strings.Repeat("k", 200)
	for _, m := range []*outbox.Message{
		{Key: "K-1", Destination: dest, Payload: []byte("1"), OrderingKey: "acct-42"},
		{Key: long, Destination: dest, Payload: []byte("2")},
		{Key: long, Destination: dest, Payload: []byte("2")}, // the relay's resend
	} {
		if res := s.Send(context.Background(), m); res.Status != outbox.Sent {
			t.Fatalf("%s: %s (%v)", m.Key, res.Status, res.Err)
		}
	}
	out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10,
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}, WaitTimeSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]string{}
	for _, m := range out.Messages {
		groups[*m.Body] = m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
	}
	if len(out.Messages) != 2 || groups["1"] != "acct-42" || groups["2"] != "idem" {
		t.Fatalf("received %d messages, groups %v; want 2, acct-42 and idem", len(out.Messages), groups)
	}
}

// countingTransport counts the SQS calls made through it, by operation.
type countingTransport struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.counts[strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// TestConcurrentSendsShareBatches: sends to one queue that meet go in
// SendMessageBatch calls, each send with its own answer — one too large
// for the queue is dead, the others in its batch are sent.
func TestConcurrentSendsShareBatches(t *testing.T) {
	testenv.SQS(t)
	calls := &countingTransport{counts: map[string]int{}}
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.HTTPClient = &http.Client{Transport: calls} })
	url := testenv.SQSQueue(t, c, "idem-batch-", map[string]string{string(types.QueueAttributeNameMaximumMessageSize): "1024"})
	dest := "sqs://" + url[strings.LastIndex(url, "/")+1:]
	s := sqssender.New(sqssender.Config{Client: c})
	const n = 200
	results := make([]outbox.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := []byte(fmt.Sprintf("payload %03d", i))
			if i == 7 {
				payload = []byte(strings.Repeat("x", 2048))
			}
			results[i] = s.Send(context.Background(), &outbox.Message{Key: fmt.Sprintf("K-%03d", i), Destination: dest, Payload: payload})
		}()
	}
	wg.Wait()
	for i, res := range results {
		if want := outbox.Sent; i == 7 && res.Status != outbox.Dead || i != 7 && res.Status != want {
			t.Fatalf("send %d: %s (%v)", i, res.Status, res.Err)
		}
	}
	calls.mu.Lock()
	sends := calls.counts["SendMessage"] + calls.counts["SendMessageBatch"]
	calls.mu.Unlock()
	if calls.counts["SendMessageBatch"] == 0 || sends > n/2 {
		t.Fatalf("%d sends took %v calls", n, calls.counts)
	}
	if got := drain(t, c, url)(); len(got) != n-1 {
		t.Fatalf("the queue received %d messages, want %d", len(got), n-1)
	}
	t.Logf("%d sends in %v", n, calls.counts)
}

// TestCredentialsRefused: credentials that cannot be had leave the row
// pending, saying so: the message is kept for when they can.
func TestCredentialsRefused(t *testing.T) {
	testenv.SQS(t)
	c := sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(testenv.SQS(t)), RetryMaxAttempts: 1,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{}, errors.New("no credentials in this environment")
		})})
	s := sqssender.New(sqssender.Config{Client: c})
	res := s.Send(context.Background(), &outbox.Message{Key: "K-1", Destination: "sqs://orders", Payload: []byte("x")})
	if res.Status != outbox.Pending || res.Err == nil || !strings.Contains(res.Err.Error(), "credentials") {
		t.Fatalf("%s (%v), want pending, naming the credentials", res.Status, res.Err)
	}
}
