package amqpidem

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/inbox"
)

// Config configures a handler.
type Config struct {
	// Scope names the consumer; keys are scoped by it. Required.
	Scope string
	// Key extracts the producer's id (broker.JSONKey, broker.HeaderKey,
	// CorrelationIDKey…). Required.
	Key broker.KeyFunc
	// Fingerprint tells payloads apart under one key (GuardHandler).
	// Defaults to broker.BodyFingerprint; broker.NoFingerprint skips it.
	Fingerprint broker.FingerprintFunc
	// Policy maps outcomes to acks and nacks.
	Policy broker.Policy
	// Context is the parent of every handler's context. Defaults to
	// context.Background().
	Context context.Context
	// TracerProvider, if set, traces each delivery (GuardHandler,
	// InboxHandler): a span "process <queue>" continuing the producer's
	// trace from the traceparent header; the work runs in it.
	TracerProvider trace.TracerProvider
	// OnDecision, if set, hears every decision once it is applied.
	OnDecision func(d *amqp.Delivery, dec broker.Decision)
	// Concurrency is how many deliveries the handler runs at once.
	// Defaults to 1. Above 1, deliveries complete out of order (the keys
	// keep the duplicates apart); set the channel's prefetch (Qos) at least
	// this high, or the broker sends no more than that many unacked.
	Concurrency int
}

func (c *Config) validate() error {
	if c.Scope == "" || c.Key == nil {
		return errors.New("idem/amqpidem: Config.Scope and Config.Key are required")
	}
	if c.Context == nil {
		c.Context = context.Background()
	}
	if c.Fingerprint == nil {
		c.Fingerprint = broker.BodyFingerprint
	}
	if c.Concurrency < 0 {
		return errors.New("idem/amqpidem: Config.Concurrency must not be negative")
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	return nil
}

type message struct{ d *amqp.Delivery }

func (m message) Header(name string) string {
	if v, ok := m.d.Headers[name]; ok {
		return fmt.Sprint(v)
	}
	return ""
}
func (m message) Body() []byte { return m.d.Body }

// CorrelationIDKey takes the key from the AMQP correlation-id property.
func CorrelationIDKey(m broker.Message) (string, error) {
	if dm, ok := m.(message); ok && dm.d.CorrelationId != "" {
		return dm.d.CorrelationId, nil
	}
	return "", errors.New("idem/amqpidem: the message has no correlation-id")
}

// MessageIDKey takes the key from the AMQP message-id property: where a
// publisher that sets its own ids puts them — idem's outbox sender
// (outbox/amqpsender) writes its key there, the same on every retry. The
// broker keeps the property on redelivery and dead-lettering; a publisher
// that lets its client library make up a new id per publish must not be
// keyed on it.
func MessageIDKey(m broker.Message) (string, error) {
	if dm, ok := m.(message); ok && dm.d.MessageId != "" {
		return dm.d.MessageId, nil
	}
	return "", errors.New("idem/amqpidem: the message has no message-id")
}

// attempt is x-delivery-count + 1 on quorum queues; elsewhere 1, or 2 for a
// redelivery.
func attempt(d *amqp.Delivery) int {
	switch n := d.Headers["x-delivery-count"].(type) {
	case int64:
		return int(n) + 1
	case int32:
		return int(n) + 1
	}
	if d.Redelivered {
		return 2
	}
	return 1
}

// GuardHandler returns a handler that runs work at most once per key
// through g.
func GuardHandler(g *idem.Guard, cfg Config, work func(ctx context.Context, d *amqp.Delivery, fence uint64) ([]byte, error)) (func(amqp.Delivery), error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg.handler(func(ctx context.Context, d *amqp.Delivery, id string) broker.Decision {
		res, err := g.Run(ctx, idem.Key{Scope: cfg.Scope, ID: id}, &idem.RunOptions{Fingerprint: cfg.Fingerprint(message{d})},
			func(ctx context.Context, fence uint64) ([]byte, error) { return work(ctx, d, fence) })
		return cfg.Policy.FromGuard(res, err, attempt(d))
	}), nil
}

// InboxHandler returns a handler for the transactional inbox: process runs
// the business change and the inbox claim in one transaction.
func InboxHandler(cfg Config, process func(ctx context.Context, d *amqp.Delivery, id string) (inbox.Outcome, error)) (func(amqp.Delivery), error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg.handler(func(ctx context.Context, d *amqp.Delivery, id string) broker.Decision {
		out, err := process(ctx, d, id)
		return cfg.Policy.FromInbox(out, err, attempt(d))
	}), nil
}

// handler runs one delivery at a time, or Concurrency at once; one
// extracts the key (a delivery without one is dead-lettered), runs decide
// and applies the decision.
func (c *Config) handler(decide func(ctx context.Context, d *amqp.Delivery, id string) broker.Decision) func(amqp.Delivery) {
	h := c.one(decide)
	if c.Concurrency <= 1 {
		return h
	}
	slots := make(chan struct{}, c.Concurrency) // the delivery loop waits for a free slot
	return func(d amqp.Delivery) {
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			h(d)
		}()
	}
}

func (c *Config) one(decide func(ctx context.Context, d *amqp.Delivery, id string) broker.Decision) func(amqp.Delivery) {
	return func(d amqp.Delivery) {
		id, err := c.Key(message{&d})
		if err != nil {
			c.apply(&d, broker.Decision{Verdict: broker.DeadLetter, Reason: "no key: " + err.Error()})
			return
		}
		if c.TracerProvider == nil {
			c.apply(&d, decide(c.Context, &d, id))
			return
		}
		queue := d.RoutingKey
		if d.Exchange != "" {
			queue = d.Exchange
		}
		ctx, span := broker.StartConsume(c.Context, c.TracerProvider, message{&d}, "rabbitmq", queue, id)
		dec := decide(ctx, &d, id)
		broker.EndConsume(span, dec)
		c.apply(&d, dec)
	}
}

func (c *Config) apply(d *amqp.Delivery, dec broker.Decision) {
	switch dec.Verdict {
	case broker.Ack:
		_ = d.Ack(false)
	case broker.Retry:
		// RabbitMQ has no delayed nack: keep the delivery unacked for the
		// delay, then requeue it. A closed channel requeues it anyway.
		if dec.Delay <= 0 {
			_ = d.Nack(false, true)
		} else {
			time.AfterFunc(dec.Delay, func() { _ = d.Nack(false, true) })
		}
	case broker.DeadLetter:
		_ = d.Reject(false)
	}
	if c.OnDecision != nil {
		c.OnDecision(d, dec)
	}
}

// Consume runs handler on every delivery of queue (manual acks) until ctx
// ends or the channel closes. It returns nil when ctx ended.
func Consume(ctx context.Context, ch *amqp.Channel, queue, consumer string, handler func(amqp.Delivery)) error {
	deliveries, err := ch.ConsumeWithContext(ctx, queue, consumer, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("idem/amqpidem: consume %s: %w", queue, err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("idem/amqpidem: the channel of %s closed", queue)
			}
			handler(d)
		}
	}
}

// Batch configures InboxBatches: the transactional inbox, run for many
// deliveries in one transaction.
type Batch[TTx any] struct {
	// Inbox records the keys. Required.
	Inbox *inbox.Inbox[TTx]
	// Process makes one delivery's business change in tx, under the
	// delivery's own savepoint. Required.
	Process func(ctx context.Context, tx TTx, d *amqp.Delivery) error
	// Size is the most deliveries one transaction runs. Defaults to 50 (at
	// most 64 on PostgreSQL: see inbox.Inbox.ProcessBatch). Keep the
	// channel's prefetch at least Size × Concurrency.
	Size int
	// Event maps a delivery and its key to its inbox event. Defaults to
	// {Consumer: Scope, CorrelationID: key}.
	Event func(d *amqp.Delivery, key string) inbox.Event
}

// BatchHandler runs deliveries through a transactional inbox in batches:
// Concurrency workers each take the deliveries waiting (up to Batch.Size,
// without waiting for more) and run them in one transaction with one commit
// (inbox.Inbox.ProcessBatch). A delivery whose Process fails is rolled back
// alone and retried per the Policy; the others are acked once the
// transaction commits; if the transaction fails, all are retried.
type BatchHandler[TTx any] struct {
	cfg     Config
	b       Batch[TTx]
	batcher *broker.Batcher[*amqp.Delivery]
}

// InboxBatches returns a BatchHandler; hand its Handle to Consume, and call
// Close once consuming stopped.
func InboxBatches[TTx any](cfg Config, b Batch[TTx]) (*BatchHandler[TTx], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if b.Inbox == nil || b.Process == nil {
		return nil, errors.New("idem/amqpidem: Batch.Inbox and Batch.Process are required")
	}
	if b.Size == 0 {
		b.Size = 50
	}
	if b.Size < 0 || b.Size > inbox.MaxBatch {
		return nil, errors.New("idem/amqpidem: Batch.Size must be 1 to inbox.MaxBatch")
	}
	if b.Event == nil {
		scope := cfg.Scope
		b.Event = func(_ *amqp.Delivery, key string) inbox.Event {
			return inbox.Event{Consumer: scope, CorrelationID: key}
		}
	}
	h := &BatchHandler[TTx]{cfg: cfg, b: b}
	h.batcher = broker.NewBatcher(b.Size, cfg.Concurrency, h.run)
	return h, nil
}

// Handle queues d for a batch (the handler of Consume). It blocks while
// every worker is busy and the queue is full.
func (h *BatchHandler[TTx]) Handle(d amqp.Delivery) { h.batcher.Add(&d) }

// Close runs the deliveries already handed over and waits for them.
func (h *BatchHandler[TTx]) Close() { h.batcher.Close() }

func (h *BatchHandler[TTx]) run(ds []*amqp.Delivery) {
	keyed := make([]*amqp.Delivery, 0, len(ds))
	ids := make(map[*amqp.Delivery]string, len(ds))
	for _, d := range ds {
		id, err := h.cfg.Key(message{d})
		if err != nil {
			h.cfg.apply(d, broker.Decision{Verdict: broker.DeadLetter, Reason: "no key: " + err.Error()})
			continue
		}
		keyed, ids[d] = append(keyed, d), id
	}
	if len(keyed) == 0 {
		return
	}
	results, err := inbox.RunBatch(h.cfg.Context, h.b.Inbox, keyed,
		func(d *amqp.Delivery) inbox.Event { return h.b.Event(d, ids[d]) }, h.b.Process)
	for n, d := range keyed {
		if err != nil {
			h.cfg.apply(d, h.cfg.Policy.FromInbox(nil, err, attempt(d)))
			continue
		}
		h.cfg.apply(d, h.cfg.Policy.FromInbox(results[n].Outcome, results[n].Err, attempt(d)))
	}
}
