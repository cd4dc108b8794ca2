package sqsidem_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/sqsidem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/store/memstore"
)

func send(t *testing.T, c *sqs.Client, url, body string, attrs map[string]string, group string) {
	t.Helper()
	in := &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(body), MessageAttributes: map[string]types.MessageAttributeValue{}}
	for k, v := range attrs {
		in.MessageAttributes[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	if group != "" {
		in.MessageGroupId, in.MessageDeduplicationId = aws.String(group), aws.String(testenv.RandomName("d-"))
	}
	if _, err := c.SendMessage(context.Background(), in); err != nil {
		t.Fatal(err)
	}
}

// run runs cons until t ends.
func run(t *testing.T, cons *sqsidem.Consumer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

func guard(t *testing.T, cfg idem.Config) *idem.Guard {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	cfg.Store = s
	g, err := idem.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// depth is how many messages url holds, visible or not.
func depth(t *testing.T, c *sqs.Client, url string) (visible, inFlight string) {
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		t.Fatal(err)
	}
	return out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)], out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)]
}

// TestVisibilityKeptWhileTheWorkRuns: work that runs three times the
// visibility timeout is not received by another consumer meanwhile — the
// Guard's heartbeats extend the message's visibility with the claim's
// lease — and the message is deleted once it completed.
func TestVisibilityKeptWhileTheWorkRuns(t *testing.T) {
	c := testenv.SQSClient(t)
	url, dlq := testenv.SQSQueue(t, c, "idem-vis-", nil), testenv.SQSQueue(t, c, "idem-vis-dlq-", nil)
	started, release := make(chan struct{}), make(chan struct{})
	decided := make(chan broker.Decision, 1)
	cons, err := sqsidem.GuardConsumer(guard(t, idem.Config{Lease: 1500 * time.Millisecond}), sqsidem.Config{
		Client: c, QueueURL: url, DeadLetterQueueURL: dlq, Scope: "vis", VisibilityTimeout: time.Second, WaitTime: time.Second,
		OnDecision: func(_ *sqsidem.Message, d broker.Decision) { decided <- d },
	}, func(ctx context.Context, m *sqsidem.Message, fence uint64) ([]byte, error) {
		close(started)
		<-release
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, cons)
	send(t, c, url, "credit 10", map[string]string{sqsidem.KeyAttribute: "PAY-1"}, "")
	<-started
	// Another consumer polls for three visibility timeouts: nothing.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), WaitTimeSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) > 0 {
			t.Fatal("another consumer received the message while its work ran")
		}
	}
	close(release)
	if d := <-decided; d.Verdict != broker.Ack {
		t.Fatalf("decision %+v, want ack", d)
	}
	testenv.Eventually(t, 10*time.Second, "the message deleted", func() error {
		if v, f := depth(t, c, url); v != "0" || f != "0" {
			return fmt.Errorf("%s visible, %s in flight", v, f)
		}
		return nil
	})
}

// TestRedrivePolicyDeadLetters: without DeadLetterQueueURL, a message that
// must be dead-lettered goes back to the queue until its redrive policy
// moves it to the dead-letter queue; the work never runs.
func TestRedrivePolicyDeadLetters(t *testing.T) {
	c := testenv.SQSClient(t)
	dlq := testenv.SQSQueue(t, c, "idem-redrive-dlq-", nil)
	arn, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(dlq), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"2"}`, arn.Attributes[string(types.QueueAttributeNameQueueArn)])
	url := testenv.SQSQueue(t, c, "idem-redrive-", map[string]string{string(types.QueueAttributeNameRedrivePolicy): policy})
	var runs atomic.Int32
	cons, err := sqsidem.GuardConsumer(guard(t, idem.Config{}), sqsidem.Config{Client: c, QueueURL: url, Scope: "redrive", WaitTime: time.Second},
		func(context.Context, *sqsidem.Message, uint64) ([]byte, error) { runs.Add(1); return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	run(t, cons)
	send(t, c, url, "no key", nil, "")
	testenv.Eventually(t, 20*time.Second, "the keyless message in the dead-letter queue", func() error {
		if v, _ := depth(t, c, dlq); v != "1" {
			return fmt.Errorf("the dead-letter queue holds %s", v)
		}
		return nil
	})
	if runs.Load() != 0 {
		t.Fatalf("the work ran %d times", runs.Load())
	}
}

// TestRunRefusesWhatCannotWork: a queue that does not exist, a dead-letter
// queue that does not exist, and a queue without a dead-letter path each
// stop Run at once, saying which, as do credentials that cannot be had; a
// malformed URL, or none, is refused when the Consumer is made.
func TestRunRefusesWhatCannotWork(t *testing.T) {
	c := testenv.SQSClient(t)
	url := testenv.SQSQueue(t, c, "idem-refuse-", nil)
	base := url[:strings.LastIndex(url, "/")+1]
	noop := func(context.Context, *sqsidem.Message, uint64) ([]byte, error) { return nil, nil }
	for name, cfg := range map[string]sqsidem.Config{
		"missing queue":       {QueueURL: base + "idem-no-such-queue", DeadLetterQueueURL: url},
		"malformed URL":       {QueueURL: "::not a url", DeadLetterQueueURL: url},
		"missing DLQ":         {QueueURL: url, DeadLetterQueueURL: base + "idem-no-such-dlq"},
		"no dead-letter path": {QueueURL: url},
	} {
		cfg.Client, cfg.Scope = c, "refuse"
		cons, err := sqsidem.GuardConsumer(guard(t, idem.Config{}), cfg, noop)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err = cons.Run(ctx)
			if ctx.Err() != nil {
				err = nil // it ran: it did not refuse
			}
			cancel()
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.Contains(err.Error(), "queue") && !strings.Contains(err.Error(), "QueueURL") {
			t.Errorf("%s: %v does not say which queue", name, err)
		}
	}
	if _, err := sqsidem.GuardConsumer(guard(t, idem.Config{}), sqsidem.Config{Client: c, Scope: "refuse"}, noop); err == nil {
		t.Error("a configuration without a queue was accepted")
	}
	// Credentials that cannot be had: Run says so.
	noCreds := sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(testenv.SQS(t)), RetryMaxAttempts: 1,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{}, errors.New("no credentials in this environment")
		})})
	cons, err := sqsidem.GuardConsumer(guard(t, idem.Config{}), sqsidem.Config{Client: noCreds, QueueURL: url, DeadLetterQueueURL: url, Scope: "refuse"}, noop)
	if err != nil {
		t.Fatal(err)
	}
	if err := cons.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "credentials") {
		t.Errorf("without credentials: Run returned %v", err)
	}
}

// TestFIFOGroupInOrder: a FIFO group's messages run one after the other in
// their order; one that must run again sends the rest of its group back
// with it, so the order holds across the retry.
func TestFIFOGroupInOrder(t *testing.T) {
	c := testenv.SQSClient(t)
	fifo := map[string]string{string(types.QueueAttributeNameFifoQueue): "true"}
	url, dlq := testenv.SQSQueue(t, c, "idem-order-", fifo), testenv.SQSQueue(t, c, "idem-order-dlq-", fifo)
	var mu sync.Mutex
	var order []string
	failed := false
	done := make(chan struct{})
	cons, err := sqsidem.GuardConsumer(guard(t, idem.Config{}), sqsidem.Config{Client: c, QueueURL: url, DeadLetterQueueURL: dlq, Scope: "order",
		Concurrency: 4, WaitTime: time.Second, Policy: broker.Policy{BackoffMin: time.Millisecond, BackoffMax: time.Millisecond}},
		func(ctx context.Context, m *sqsidem.Message, fence uint64) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			id := string(m.Data)
			if id == "2" && !failed {
				failed = true
				return nil, errors.New("ledger unavailable") // released: runs again
			}
			order = append(order, id)
			if len(order) == 5 {
				close(done)
			}
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		send(t, c, url, fmt.Sprint(i), map[string]string{sqsidem.KeyAttribute: fmt.Sprint("K-", i)}, "acct-42")
	}
	run(t, cons)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("ran %v", order)
	}
	if got := strings.Join(order, ","); got != "1,2,3,4,5" {
		t.Fatalf("the group ran in the order %s", got)
	}
}

// TestInboxConsumer: the inbox keys each message by the producer's key in
// the database's own transaction: a redelivery with another SQS message id
// commits nothing; a binary payload sent as base64 arrives decoded.
func TestInboxConsumer(t *testing.T) {
	c := testenv.SQSClient(t)
	url, dlq := testenv.SQSQueue(t, c, "idem-inbox-", nil), testenv.SQSQueue(t, c, "idem-inbox-dlq-", nil)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "app.db")+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ib, err := inbox.New(databasesql.New(db, sqldriver.SQLite), inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	outcomes := make(chan string, 4)
	var payloads sync.Map
	cons, err := sqsidem.InboxConsumer(sqsidem.Config{Client: c, QueueURL: url, DeadLetterQueueURL: dlq, Scope: "inbox", WaitTime: time.Second},
		func(ctx context.Context, m *sqsidem.Message, id string) (inbox.Outcome, error) {
			out, err := ib.Process(ctx, inbox.Event{Consumer: "inbox", CorrelationID: id}, func(ctx context.Context, tx *sql.Tx) error {
				payloads.Store(id, string(m.Data))
				return nil
			})
			outcomes <- out.String()
			return out, err
		})
	if err != nil {
		t.Fatal(err)
	}
	run(t, cons)
	body := map[string]string{sqsidem.KeyAttribute: "PAY-7", sqsidem.EncodingAttribute: "base64"}
	send(t, c, url, "AP8B", body, "") // 0x00 0xff 0x01
	if got := <-outcomes; got != "processed" {
		t.Fatalf("first delivery: %s", got)
	}
	send(t, c, url, "AP8B", body, "") // the producer's resend: a new message id
	if got := <-outcomes; got != "duplicate" {
		t.Fatalf("second delivery: %s", got)
	}
	if p, _ := payloads.Load("PAY-7"); p != "\x00\xff\x01" {
		t.Fatalf("payload %q", p)
	}
}

// TestWaitingMessagesStayInvisible: a consumer received more than it runs
// at once (one at a time here, a receive being ten); the messages that
// wait for their turn stay invisible to other consumers meanwhile.
func TestWaitingMessagesStayInvisible(t *testing.T) {
	c := testenv.SQSClient(t)
	url, dlq := testenv.SQSQueue(t, c, "idem-wait-", nil), testenv.SQSQueue(t, c, "idem-wait-dlq-", nil)
	started, release := make(chan struct{}, 2), make(chan struct{})
	var runs atomic.Int32
	cons, err := sqsidem.GuardConsumer(guard(t, idem.Config{Lease: 1500 * time.Millisecond}), sqsidem.Config{
		Client: c, QueueURL: url, DeadLetterQueueURL: dlq, Scope: "wait", VisibilityTimeout: time.Second, WaitTime: time.Second,
	}, func(ctx context.Context, m *sqsidem.Message, fence uint64) ([]byte, error) {
		runs.Add(1)
		started <- struct{}{}
		<-release
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	send(t, c, url, "credit 1", map[string]string{sqsidem.KeyAttribute: "PAY-1"}, "")
	send(t, c, url, "credit 2", map[string]string{sqsidem.KeyAttribute: "PAY-2"}, "")
	run(t, cons)
	<-started
	testenv.Eventually(t, 10*time.Second, "both messages received", func() error {
		if _, f := depth(t, c, url); f != "2" {
			return fmt.Errorf("%s in flight", f)
		}
		return nil
	})
	deadline := time.Now().Add(3 * time.Second) // three visibility timeouts
	for time.Now().Before(deadline) {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), WaitTimeSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) > 0 {
			t.Fatalf("another consumer received %q while it waited", *out.Messages[0].Body)
		}
	}
	close(release)
	<-started
	testenv.Eventually(t, 10*time.Second, "both messages deleted", func() error {
		if v, f := depth(t, c, url); v != "0" || f != "0" {
			return fmt.Errorf("%s visible, %s in flight", v, f)
		}
		return nil
	})
	if runs.Load() != 2 {
		t.Fatalf("%d runs", runs.Load())
	}
}
