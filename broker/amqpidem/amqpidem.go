package amqpidem

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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
	return cfg.handler(func(d *amqp.Delivery, id string) broker.Decision {
		res, err := g.Run(cfg.Context, idem.Key{Scope: cfg.Scope, ID: id}, &idem.RunOptions{Fingerprint: cfg.Fingerprint(message{d})},
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
	return cfg.handler(func(d *amqp.Delivery, id string) broker.Decision {
		out, err := process(cfg.Context, d, id)
		return cfg.Policy.FromInbox(out, err, attempt(d))
	}), nil
}

// handler runs one delivery at a time, or Concurrency at once; one
// extracts the key (a delivery without one is dead-lettered), runs decide
// and applies the decision.
func (c *Config) handler(decide func(d *amqp.Delivery, id string) broker.Decision) func(amqp.Delivery) {
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

func (c *Config) one(decide func(d *amqp.Delivery, id string) broker.Decision) func(amqp.Delivery) {
	return func(d amqp.Delivery) {
		id, err := c.Key(message{&d})
		if err != nil {
			c.apply(&d, broker.Decision{Verdict: broker.DeadLetter, Reason: "no key: " + err.Error()})
			return
		}
		c.apply(&d, decide(&d, id))
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
