package sqsidem

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/ctxsleep"
)

// Message attributes.
const (
	// KeyAttribute carries the producer's key (the default Config.Key).
	KeyAttribute = "Idempotency-Key"
	// ReasonAttribute says, on a dead-letter copy, why it was dead-lettered.
	ReasonAttribute = "Idem-Reason"
	// EncodingAttribute is "base64" on a message whose body is its payload
	// in standard base64 (outbox/sqssender writes binary payloads so);
	// Message.Data is then the decoded payload.
	EncodingAttribute = "Idem-Body-Encoding"
)

// Message is a received message with its payload.
type Message struct {
	types.Message
	// Data is the payload: the body, decoded where EncodingAttribute says
	// it is base64.
	Data []byte
}

// Header returns the string value of a message attribute ("" when
// absent); it makes a Message a broker.Message.
func (m *Message) Header(name string) string {
	if a, ok := m.MessageAttributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// Body returns Data.
func (m *Message) Body() []byte { return m.Data }

// DeduplicationIDKey is the key of a FIFO queue's message: its
// MessageDeduplicationId, as the producer set it (or SQS derived it from
// the body, with content-based deduplication).
func DeduplicationIDKey(m broker.Message) (string, error) {
	if sm, ok := m.(*Message); ok {
		if id := sm.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]; id != "" {
			return id, nil
		}
	}
	return "", errors.New("idem/sqsidem: the message has no MessageDeduplicationId (not from a FIFO queue)")
}

// Config configures a Consumer.
type Config struct {
	// Client is the SQS client. Required.
	Client *sqs.Client
	// QueueURL is the queue's URL (sqs.GetQueueUrl gives it from its
	// name). Required.
	QueueURL string
	// Scope names the consumer; keys are scoped by it. Required.
	Scope string
	// Key extracts the producer's id. Defaults to the KeyAttribute message
	// attribute.
	Key broker.KeyFunc
	// Fingerprint tells payloads apart under one key (GuardConsumer).
	// Defaults to broker.BodyFingerprint; broker.NoFingerprint skips it.
	Fingerprint broker.FingerprintFunc
	// Policy maps outcomes to deletes and delays.
	Policy broker.Policy
	// Concurrency is how many messages run at once. Defaults to 1.
	Concurrency int
	// VisibilityTimeout is how long a received message stays invisible to
	// other consumers; it is extended by as much while the work runs — by
	// each heartbeat of the Guard (keep the Guard's HeartbeatInterval
	// below it; its default, a third of the lease, is with the default
	// lease of 30s), every third of it for the inbox. Defaults to 30s;
	// whole seconds, at most 12 hours.
	VisibilityTimeout time.Duration
	// WaitTime is how long a receive waits for messages (long polling).
	// Defaults to 20s, the most SQS allows.
	WaitTime time.Duration
	// DeadLetterQueueURL, if set, receives a copy of every dead-lettered
	// message (with ReasonAttribute) before it is deleted. Without it, the
	// queue's redrive policy dead-letters it.
	DeadLetterQueueURL string
	// Context is the parent of the work's contexts: Run's context ending
	// stops the receives, not the work in hand. Defaults to
	// context.Background().
	Context context.Context
	// OnDecision, if set, hears every decision (for logs and metrics).
	OnDecision func(m *Message, d broker.Decision)
	// OnError, if set, hears what failed on the way — a receive, a
	// delete, a change of visibility — that SQS's redelivery will mend.
	OnError func(error)
	// TracerProvider, if set, traces each message: a span "process
	// <queue>" continuing the producer's trace from the message's
	// traceparent attribute.
	TracerProvider trace.TracerProvider
}

func (c *Config) validate() error {
	if c.Client == nil || c.QueueURL == "" || c.Scope == "" {
		return errors.New("idem/sqsidem: Config.Client, Config.QueueURL and Config.Scope are required")
	}
	for _, q := range []string{c.QueueURL, c.DeadLetterQueueURL} {
		if u, err := url.Parse(q); q != "" && (err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "") {
			return fmt.Errorf("idem/sqsidem: %q is not a queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)", q)
		}
	}
	if c.Key == nil {
		c.Key = broker.HeaderKey(KeyAttribute)
	}
	if c.Fingerprint == nil {
		c.Fingerprint = broker.BodyFingerprint
	}
	if c.Concurrency < 0 {
		return errors.New("idem/sqsidem: Config.Concurrency must not be negative")
	}
	c.Concurrency = max(c.Concurrency, 1)
	if c.VisibilityTimeout == 0 {
		c.VisibilityTimeout = 30 * time.Second
	}
	if c.VisibilityTimeout < time.Second || c.VisibilityTimeout > 12*time.Hour {
		return fmt.Errorf("idem/sqsidem: Config.VisibilityTimeout %v: want 1s to 12h", c.VisibilityTimeout)
	}
	if c.WaitTime == 0 {
		c.WaitTime = 20 * time.Second
	}
	if c.WaitTime < 0 || c.WaitTime > 20*time.Second {
		return fmt.Errorf("idem/sqsidem: Config.WaitTime %v: want up to 20s", c.WaitTime)
	}
	if c.Context == nil {
		c.Context = context.Background()
	}
	return nil
}

// decideFunc runs a message of key id and says what to do with it.
type decideFunc func(ctx context.Context, m *Message, id string) broker.Decision

// Consumer consumes one queue. Run it once.
type Consumer struct {
	cfg     Config
	decide  decideFunc
	extends bool // decide extends the visibility itself (the Guard's heartbeats)
	fifo    bool
	queue   string // the queue's name, for spans
	deletes *broker.Batcher[*Message]
}

// GuardConsumer returns a Consumer that runs work at most once per key
// through g. The fence is handed to work.
func GuardConsumer(g *idem.Guard, cfg Config, work func(ctx context.Context, m *Message, fence uint64) ([]byte, error)) (*Consumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, extends: true}
	c.decide = func(ctx context.Context, m *Message, id string) broker.Decision {
		opts := idem.RunOptions{Fingerprint: cfg.Fingerprint(m), Progress: func() { go c.extend(m) }}
		res, err := g.Run(ctx, idem.Key{Scope: cfg.Scope, ID: id}, &opts,
			func(ctx context.Context, fence uint64) ([]byte, error) { return work(ctx, m, fence) })
		return cfg.Policy.FromGuard(res, err, receiveCount(m))
	}
	return c, nil
}

// InboxConsumer returns a Consumer for the transactional inbox: process
// runs the business change and inbox.ClaimTx (or Process…) in one
// transaction, keyed by the id the Key function extracted.
func InboxConsumer(cfg Config, process func(ctx context.Context, m *Message, id string) (inbox.Outcome, error)) (*Consumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg}
	c.decide = func(ctx context.Context, m *Message, id string) broker.Decision {
		out, err := process(ctx, m, id)
		return cfg.Policy.FromInbox(out, err, receiveCount(m))
	}
	return c, nil
}

// systemAttributes are the system attributes a receive asks for: what the
// policy (the receive count), FIFO groups and DeduplicationIDKey need.
var systemAttributes = []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount,
	types.MessageSystemAttributeNameMessageGroupId, types.MessageSystemAttributeNameMessageDeduplicationId}

func receiveCount(m *Message) int {
	if n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 0 {
		return n
	}
	return 1
}

func (c *Consumer) report(err error) {
	if c.cfg.OnError != nil && err != nil {
		c.cfg.OnError(err)
	}
}

// Run consumes until ctx ends, then waits for the messages in hand and
// their deletes. It fails at once if the queue cannot be read, or if a
// dead-lettered message would have nowhere to go: no DeadLetterQueueURL and
// no redrive policy on the queue.
func (c *Consumer) Run(ctx context.Context) error {
	attrs, err := c.cfg.Client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(c.cfg.QueueURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameRedrivePolicy, types.QueueAttributeNameFifoQueue}})
	if err != nil {
		return fmt.Errorf("idem/sqsidem: the queue %s: %w", c.cfg.QueueURL, err)
	}
	if c.cfg.DeadLetterQueueURL != "" {
		if _, err := c.cfg.Client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(c.cfg.DeadLetterQueueURL),
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}}); err != nil {
			return fmt.Errorf("idem/sqsidem: the dead-letter queue %s: %w", c.cfg.DeadLetterQueueURL, err)
		}
	} else if attrs.Attributes[string(types.QueueAttributeNameRedrivePolicy)] == "" {
		return fmt.Errorf("idem/sqsidem: the queue %s has no redrive policy and Config.DeadLetterQueueURL is not set: a dead-lettered message would have nowhere to go", c.cfg.QueueURL)
	}
	c.fifo = attrs.Attributes[string(types.QueueAttributeNameFifoQueue)] == "true"
	c.queue = c.cfg.QueueURL[strings.LastIndex(c.cfg.QueueURL, "/")+1:]
	c.deletes = broker.NewBatcher(10, 1, c.deleteBatch)
	defer c.deletes.Close()

	// Held: the messages received and not yet finished — Concurrency
	// running and a receive's worth per receiver waiting, so that receives
	// of ten are under way while the work runs.
	receivers := min(4, 1+c.cfg.Concurrency/8)
	held := make(chan struct{}, c.cfg.Concurrency+10*receivers)
	running := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	var rwg sync.WaitGroup
	for range receivers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			c.receive(ctx, held, running, &wg)
		}()
	}
	rwg.Wait()
	return nil
}

// receive receives ten messages at a time while ctx lasts, once held has
// room for them, and starts their runs, Concurrency at once.
func (c *Consumer) receive(ctx context.Context, held, running chan struct{}, wg *sync.WaitGroup) {
	failures := 0
	for ctx.Err() == nil {
		n := 0
		for ; n < 10; n++ {
			select {
			case held <- struct{}{}:
				continue
			case <-ctx.Done():
			}
			break
		}
		if ctx.Err() != nil {
			for range n {
				<-held
			}
			return
		}
		out, err := c.cfg.Client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(c.cfg.QueueURL), MaxNumberOfMessages: int32(n),
			WaitTimeSeconds: int32(c.cfg.WaitTime / time.Second), VisibilityTimeout: seconds(c.cfg.VisibilityTimeout),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: systemAttributes,
		})
		var msgs []types.Message
		if err == nil {
			msgs, failures = out.Messages, 0
		} else if ctx.Err() == nil {
			failures++
			c.report(fmt.Errorf("idem/sqsidem: receive: %w", err))
			ctxsleep.Sleep(ctx, min(time.Duration(failures)*time.Second, 10*time.Second))
		}
		for range n - len(msgs) {
			<-held
		}
		for _, r := range c.runs(msgs) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.waitToRun(running, r.msgs)
				defer func() { <-running }()
				r.run(func() { <-held })
			}()
		}
	}
}

// runs groups a receive's messages into what runs at once: each message
// alone on a standard queue; on a FIFO queue each message group's, one
// after the other.
func (c *Consumer) runs(msgs []types.Message) []run {
	var runs []run
	if !c.fifo {
		for i := range msgs {
			runs = append(runs, run{[]*types.Message{&msgs[i]}, func(free func()) { c.one(&msgs[i]); free() }})
		}
		return runs
	}
	groups := map[string][]*types.Message{}
	var order []string
	for i := range msgs {
		g := msgs[i].Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], &msgs[i])
	}
	for _, g := range order {
		group := groups[g]
		runs = append(runs, run{group, func(free func()) {
			for i, m := range group {
				if !c.one(m) {
					// Its group's later messages go back with it, in order.
					for _, rest := range group[i+1:] {
						c.setVisibility(rest.ReceiptHandle, 0)
						free()
					}
					free()
					return
				}
				free()
			}
		}})
	}
	return runs
}

// run is what runs at once: a message, or a FIFO group's messages of one
// receive; its function frees one held place per message it ends.
type run struct {
	msgs []*types.Message
	run  func(free func())
}

// waitToRun takes a place among the Concurrency running, keeping msgs
// invisible to other consumers while they wait for it.
func (c *Consumer) waitToRun(running chan struct{}, msgs []*types.Message) {
	select {
	case running <- struct{}{}:
		return
	default:
	}
	t := time.NewTicker(c.cfg.VisibilityTimeout / 3)
	defer t.Stop()
	for {
		select {
		case running <- struct{}{}:
			return
		case <-t.C:
			for _, m := range msgs {
				c.setVisibility(m.ReceiptHandle, c.cfg.VisibilityTimeout)
			}
		}
	}
}

// one runs a message and applies the decision; it reports whether the
// message was deleted.
func (c *Consumer) one(raw *types.Message) bool {
	m := &Message{Message: *raw}
	data, err := decodeBody(raw)
	if err != nil {
		return c.apply(m, broker.Decision{Verdict: broker.DeadLetter, Reason: err.Error()})
	}
	m.Data = data
	id, err := c.cfg.Key(m)
	if err != nil {
		return c.apply(m, broker.Decision{Verdict: broker.DeadLetter, Reason: "no key: " + err.Error()})
	}
	ctx := c.cfg.Context
	var span trace.Span
	if c.cfg.TracerProvider != nil {
		ctx, span = broker.StartConsume(ctx, c.cfg.TracerProvider, m, "aws_sqs", c.queue, id)
	}
	var d broker.Decision
	if c.extends {
		d = c.decide(ctx, m, id)
	} else {
		stop := c.extendEvery(m)
		d = c.decide(ctx, m, id)
		stop()
	}
	if span != nil {
		broker.EndConsume(span, d)
	}
	return c.apply(m, d)
}

func decodeBody(m *types.Message) ([]byte, error) {
	body := aws.ToString(m.Body)
	if a, ok := m.MessageAttributes[EncodingAttribute]; ok && aws.ToString(a.StringValue) == "base64" {
		b, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			return nil, fmt.Errorf("the body is not the base64 its %s attribute says: %v", EncodingAttribute, err)
		}
		return b, nil
	}
	return []byte(body), nil
}

// extendEvery extends m's visibility every third of the timeout until
// stop is called.
func (c *Consumer) extendEvery(m *Message) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(c.cfg.VisibilityTimeout / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				c.extend(m)
			}
		}
	}()
	return func() { close(done) }
}

// extend makes m invisible for another VisibilityTimeout.
func (c *Consumer) extend(m *Message) { c.setVisibility(m.ReceiptHandle, c.cfg.VisibilityTimeout) }

func (c *Consumer) setVisibility(receipt *string, d time.Duration) {
	ctx, cancel := context.WithTimeout(c.cfg.Context, 10*time.Second)
	defer cancel()
	_, err := c.cfg.Client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(c.cfg.QueueURL), ReceiptHandle: receipt, VisibilityTimeout: seconds(d)})
	if err != nil {
		c.report(fmt.Errorf("idem/sqsidem: change of visibility: %w", err))
	}
}

// seconds is d in whole seconds, rounded up, within SQS's 0 to 12 hours.
func seconds(d time.Duration) int32 {
	return int32(min(max(math.Ceil(d.Seconds()), 0), 43200))
}

// apply carries out d; it reports whether m is to be deleted.
func (c *Consumer) apply(m *Message, d broker.Decision) bool {
	if c.cfg.OnDecision != nil {
		defer c.cfg.OnDecision(m, d)
	}
	switch d.Verdict {
	case broker.Ack:
		c.deletes.Add(m)
		return true
	case broker.DeadLetter:
		if c.cfg.DeadLetterQueueURL == "" {
			// The queue's redrive policy moves it once it was received
			// maxReceiveCount times: back at once.
			c.setVisibility(m.ReceiptHandle, 0)
			return false
		}
		if err := c.copyToDeadLetters(m, d.Reason); err != nil {
			// Not dead-lettered: leave it to redelivery rather than lose it.
			c.report(fmt.Errorf("idem/sqsidem: dead-letter copy: %w", err))
			c.setVisibility(m.ReceiptHandle, c.cfg.Policy.Backoff(receiveCount(m)))
			return false
		}
		c.deletes.Add(m)
		return true
	default:
		c.setVisibility(m.ReceiptHandle, d.Delay)
		return false
	}
}

func (c *Consumer) copyToDeadLetters(m *Message, reason string) error {
	attrs := map[string]types.MessageAttributeValue{}
	for k, v := range m.MessageAttributes {
		if !strings.HasPrefix(k, "Idem-") || k == EncodingAttribute {
			attrs[k] = v
		}
	}
	if len(reason) > 1024 {
		reason = reason[:1024]
	}
	if reason == "" {
		reason = "dead-lettered"
	}
	attrs[ReasonAttribute] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(reason)}
	if len(attrs) > 10 { // SQS's limit: the reason goes, the message's own attributes stay
		delete(attrs, ReasonAttribute)
	}
	in := &sqs.SendMessageInput{QueueUrl: aws.String(c.cfg.DeadLetterQueueURL), MessageBody: m.Message.Body, MessageAttributes: attrs}
	if strings.HasSuffix(c.cfg.DeadLetterQueueURL, ".fifo") {
		group := m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		if group == "" {
			group = "dead-letters"
		}
		in.MessageGroupId, in.MessageDeduplicationId = aws.String(group), m.MessageId
	}
	ctx, cancel := context.WithTimeout(c.cfg.Context, 10*time.Second)
	defer cancel()
	_, err := c.cfg.Client.SendMessage(ctx, in)
	return err
}

// deleteBatch deletes up to ten messages in one call, retrying the
// entries that failed for a reason other than a receipt handle that
// expired (the message came back: its redelivery is deleted as a
// duplicate).
func (c *Consumer) deleteBatch(msgs []*Message) {
	pending := msgs
	for try := 1; len(pending) > 0; try++ {
		entries := make([]types.DeleteMessageBatchRequestEntry, len(pending))
		for i, m := range pending {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
		}
		ctx, cancel := context.WithTimeout(c.cfg.Context, 10*time.Second)
		out, err := c.cfg.Client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(c.cfg.QueueURL), Entries: entries})
		cancel()
		var retry []*Message
		switch {
		case err != nil:
			retry = pending
		default:
			for _, f := range out.Failed {
				i, _ := strconv.Atoi(aws.ToString(f.Id))
				if i < 0 || i >= len(pending) || strings.Contains(aws.ToString(f.Code), "ReceiptHandleIsInvalid") {
					continue
				}
				retry = append(retry, pending[i])
				err = fmt.Errorf("%s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
			}
		}
		if len(retry) == 0 {
			return
		}
		if try == 3 {
			c.report(fmt.Errorf("idem/sqsidem: %d deletes failed (the messages come back and are deleted as duplicates): %w", len(retry), err))
			return
		}
		pending = retry
		ctxsleep.Sleep(c.cfg.Context, time.Duration(try)*100*time.Millisecond)
	}
}
