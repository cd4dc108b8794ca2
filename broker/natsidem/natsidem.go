package natsidem

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/ticks"
)

// ReasonHeader carries why a message was dead-lettered.
const ReasonHeader = "Idem-Reason"

// Config configures a handler.
type Config struct {
	// Scope names the consumer; keys are scoped by it. Required.
	Scope string
	// Key extracts the producer's id (broker.JSONKey, broker.HeaderKey…).
	// Required.
	Key broker.KeyFunc
	// Fingerprint tells payloads apart under one key (GuardHandler).
	// Defaults to broker.BodyFingerprint; broker.NoFingerprint skips it.
	Fingerprint broker.FingerprintFunc
	// Policy maps outcomes to acks, naks and terms.
	Policy broker.Policy
	// DeadLetterSubject, if set, receives a copy of every terminated
	// message (with the Idem-Reason header) before it is terminated;
	// JetStream must be set too.
	DeadLetterSubject string
	JetStream         jetstream.JetStream
	// ProgressInterval is how often a running message of an InboxHandler is
	// reported in progress (one timer for the handler, not one per message).
	// Defaults to 10s (keep it under the consumer's AckWait); negative
	// disables. A GuardHandler reports progress with every heartbeat of its
	// Guard instead (keep the Guard's HeartbeatInterval under the AckWait);
	// a negative ProgressInterval disables that too.
	ProgressInterval time.Duration
	// Context is the parent of every handler's context. Defaults to
	// context.Background().
	Context context.Context
	// OnDecision, if set, hears every decision (for logs and metrics).
	OnDecision func(msg jetstream.Msg, d broker.Decision)
	// Concurrency is how many messages the handler runs at once. Defaults
	// to 1. Above 1, messages complete out of order (the keys keep the
	// duplicates apart: a copy that meets its key in progress is retried
	// later); keep the consumer's MaxAckPending at least this high.
	Concurrency int
	// TracerProvider, if set, traces each message (GuardHandler,
	// InboxHandler): a span "process <subject>" continuing the producer's
	// trace from the message's traceparent header; the Guard's or the
	// inbox's work runs in it.
	TracerProvider trace.TracerProvider
	// ConfirmAcks waits for the server to confirm every ack (DoubleAck).
	// Defaults to false: a plain ack. With an idempotent handler a lost ack
	// costs only a redelivery, which is acknowledged as a duplicate, while
	// a confirmed ack costs a round trip per message.
	ConfirmAcks bool

	progress *ticks.Scheduler // InboxHandler's in-progress signals
}

func (c *Config) validate() error {
	if c.Scope == "" || c.Key == nil {
		return errors.New("idem/natsidem: Config.Scope and Config.Key are required")
	}
	if c.DeadLetterSubject != "" && c.JetStream == nil {
		return errors.New("idem/natsidem: Config.DeadLetterSubject needs Config.JetStream")
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = 10 * time.Second
	}
	if c.Context == nil {
		c.Context = context.Background()
	}
	if c.Fingerprint == nil {
		c.Fingerprint = broker.BodyFingerprint
	}
	if c.Concurrency < 0 {
		return errors.New("idem/natsidem: Config.Concurrency must not be negative")
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.ProgressInterval > 0 {
		c.progress = ticks.New(c.ProgressInterval)
	}
	return nil
}

type message struct{ m jetstream.Msg }

func (m message) Header(name string) string { return m.m.Headers().Get(name) }
func (m message) Body() []byte              { return m.m.Data() }

func attempt(m jetstream.Msg) int {
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 0 {
		return int(md.NumDelivered)
	}
	return 1
}

// GuardHandler returns a handler that runs work at most once per key through
// g. The fence is handed to work.
func GuardHandler(g *idem.Guard, cfg Config, work func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error)) (jetstream.MessageHandler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	report := cfg.ProgressInterval >= 0
	cfg.progress = nil // the Guard's heartbeats report progress
	return cfg.handler(func(ctx context.Context, msg jetstream.Msg, id string) broker.Decision {
		opts := idem.RunOptions{Fingerprint: cfg.Fingerprint(message{msg})}
		if report {
			opts.Progress = func() { _ = msg.InProgress() }
		}
		res, err := g.Run(ctx, idem.Key{Scope: cfg.Scope, ID: id}, &opts,
			func(ctx context.Context, fence uint64) ([]byte, error) { return work(ctx, msg, fence) })
		return cfg.Policy.FromGuard(res, err, attempt(msg))
	}), nil
}

// InboxHandler returns a handler for the transactional inbox: process runs
// the business change and inbox.ClaimTx (or Process…) in one transaction,
// keyed by the id the Key function extracted.
func InboxHandler(cfg Config, process func(ctx context.Context, msg jetstream.Msg, id string) (inbox.Outcome, error)) (jetstream.MessageHandler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg.handler(func(ctx context.Context, msg jetstream.Msg, id string) broker.Decision {
		out, err := process(ctx, msg, id)
		return cfg.Policy.FromInbox(out, err, attempt(msg))
	}), nil
}

// handler runs one message at a time, or Concurrency at once.
func (c *Config) handler(decide decideFunc) jetstream.MessageHandler {
	h := c.one(decide)
	if c.Concurrency <= 1 {
		return h
	}
	// Up to Concurrency messages at once; the subscription waits for a
	// free slot (back pressure).
	slots := make(chan struct{}, c.Concurrency)
	return func(msg jetstream.Msg) {
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			h(msg)
		}()
	}
}

// one handles one message: extracts the key (a message without one is
// dead-lettered), runs decide while reporting progress (InboxHandler), and
// applies the decision.
func (c *Config) one(decide decideFunc) jetstream.MessageHandler {
	return func(msg jetstream.Msg) {
		id, err := c.Key(message{msg})
		if err != nil {
			c.apply(msg, broker.Decision{Verdict: broker.DeadLetter, Reason: "no key: " + err.Error()})
			return
		}
		if c.TracerProvider != nil {
			ctx, span := broker.StartConsume(c.Context, c.TracerProvider, message{msg}, "nats", msg.Subject(), id)
			d := c.decide(ctx, decide, msg, id)
			broker.EndConsume(span, d)
			c.apply(msg, d)
			return
		}
		c.apply(msg, c.decide(c.Context, decide, msg, id))
	}
}

// decideFunc runs a message of key id in ctx and says what to tell
// JetStream.
type decideFunc func(ctx context.Context, msg jetstream.Msg, id string) broker.Decision

// decide runs decide, reporting progress meanwhile (InboxHandler).
func (c *Config) decide(ctx context.Context, decide decideFunc, msg jetstream.Msg, id string) broker.Decision {
	if c.progress == nil {
		return decide(ctx, msg, id)
	}
	p := &inProgress{msg: msg}
	c.progress.Start(&p.tick, p)
	d := decide(ctx, msg, id)
	c.progress.Stop(&p.tick)
	return d
}

// inProgress tells JetStream, on every tick, that a message is still being
// worked on.
type inProgress struct {
	tick ticks.Tick
	msg  jetstream.Msg
}

func (p *inProgress) Tick() bool { _ = p.msg.InProgress(); return true }

func (c *Config) apply(msg jetstream.Msg, d broker.Decision) {
	if c.OnDecision != nil {
		defer c.OnDecision(msg, d)
	}
	switch d.Verdict {
	case broker.Ack:
		if !c.ConfirmAcks {
			_ = msg.Ack() // lost on the way: a redelivery, acked as a duplicate
			return
		}
		ctx, cancel := context.WithTimeout(c.Context, 5*time.Second)
		defer cancel()
		if err := msg.DoubleAck(ctx); err != nil {
			_ = msg.Ack()
		}
	case broker.Retry:
		_ = msg.NakWithDelay(d.Delay)
	case broker.DeadLetter:
		if c.DeadLetterSubject != "" {
			dl := nats.NewMsg(c.DeadLetterSubject)
			dl.Data = msg.Data()
			for k, v := range msg.Headers() {
				if !keepOnDeadLetter(k) {
					continue
				}
				dl.Header[k] = v
			}
			// The copy is deduplicated on its own id, not the original's.
			if id := msg.Headers().Get(nats.MsgIdHdr); id != "" {
				dl.Header.Set(nats.MsgIdHdr, "dead-letter:"+id)
			}
			dl.Header.Set(ReasonHeader, d.Reason)
			dl.Header.Set("Idem-Original-Subject", msg.Subject())
			if _, err := c.JetStream.PublishMsg(c.Context, dl); err != nil {
				// Not dead-lettered: leave it to redelivery rather than lose it.
				_ = msg.NakWithDelay(c.Policy.Backoff(attempt(msg)))
				return
			}
		}
		_ = msg.TermWithReason(truncate(d.Reason))
	}
}

// keepOnDeadLetter tells whether a header of a message is copied onto its
// dead letter: not JetStream's publish expectations and directives
// (Nats-Expected-*, Nats-Rollup, Nats-TTL), which the original met and its
// copy, published elsewhere, would not — it would never be stored, and the
// message redelivered for ever; not the message's own Idem-* headers,
// which idem writes on the copy.
func keepOnDeadLetter(name string) bool {
	for _, prefix := range []string{"Nats-Expected-", "Nats-Rollup", "Nats-TTL", "Idem-"} {
		if len(name) >= len(prefix) && strings.EqualFold(name[:len(prefix)], prefix) {
			return false
		}
	}
	return true
}

func truncate(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}

// Batch configures InboxBatches: the transactional inbox, run for many
// messages in one transaction.
type Batch[TTx any] struct {
	// Inbox records the keys. Required.
	Inbox *inbox.Inbox[TTx]
	// Process makes one message's business change in tx, under the
	// message's own savepoint. Required.
	Process func(ctx context.Context, tx TTx, msg jetstream.Msg) error
	// Size is the most messages one transaction runs. Defaults to 50 (at
	// most 64 on PostgreSQL: see inbox.Inbox.ProcessBatch).
	Size int
	// Event maps a message and its key to its inbox event (for the version
	// guard or the event type). Defaults to {Consumer: Scope, CorrelationID:
	// key}.
	Event func(msg jetstream.Msg, key string) inbox.Event
}

// BatchHandler runs the messages of a subscription through a transactional
// inbox in batches: Concurrency workers each take the messages waiting (up
// to Batch.Size, without waiting for more) and run them in one transaction
// with one commit (inbox.Inbox.ProcessBatch). A message whose Process fails
// is rolled back alone and retried per the Policy; the others are acked
// once the transaction commits; if the transaction fails, all are retried.
type BatchHandler[TTx any] struct {
	cfg     Config
	b       Batch[TTx]
	batcher *broker.Batcher[jetstream.Msg]
}

// InboxBatches returns a BatchHandler; hand its Handle to Consume, and call
// Close after the subscription stopped. Keep the consumer's MaxAckPending at
// least Size × Concurrency.
func InboxBatches[TTx any](cfg Config, b Batch[TTx]) (*BatchHandler[TTx], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if b.Inbox == nil || b.Process == nil {
		return nil, errors.New("idem/natsidem: Batch.Inbox and Batch.Process are required")
	}
	if b.Size == 0 {
		b.Size = 50
	}
	if b.Size < 0 || b.Size > inbox.MaxBatch {
		return nil, errors.New("idem/natsidem: Batch.Size must be 1 to inbox.MaxBatch")
	}
	if b.Event == nil {
		scope := cfg.Scope
		b.Event = func(_ jetstream.Msg, key string) inbox.Event { return inbox.Event{Consumer: scope, CorrelationID: key} }
	}
	h := &BatchHandler[TTx]{cfg: cfg, b: b}
	h.batcher = broker.NewBatcher(b.Size, cfg.Concurrency, h.run)
	return h, nil
}

// Handle queues msg for a batch (a jetstream.MessageHandler). It blocks
// while every worker is busy and the queue is full.
func (h *BatchHandler[TTx]) Handle(msg jetstream.Msg) { h.batcher.Add(msg) }

// Close runs the messages already handed over and waits for them.
func (h *BatchHandler[TTx]) Close() { h.batcher.Close() }

// batchProgress tells JetStream, on every tick, that the messages of a
// batch in flight are still being worked on.
type batchProgress struct {
	tick ticks.Tick
	msgs []jetstream.Msg
}

func (p *batchProgress) Tick() bool {
	for _, m := range p.msgs {
		_ = m.InProgress()
	}
	return true
}

func (h *BatchHandler[TTx]) run(msgs []jetstream.Msg) {
	keyed := make([]jetstream.Msg, 0, len(msgs))
	ids := make(map[jetstream.Msg]string, len(msgs))
	for _, msg := range msgs {
		id, err := h.cfg.Key(message{msg})
		if err != nil {
			h.cfg.apply(msg, broker.Decision{Verdict: broker.DeadLetter, Reason: "no key: " + err.Error()})
			continue
		}
		keyed, ids[msg] = append(keyed, msg), id
	}
	if len(keyed) == 0 {
		return
	}
	var p *batchProgress
	if h.cfg.progress != nil {
		p = &batchProgress{msgs: keyed}
		h.cfg.progress.Start(&p.tick, p)
	}
	results, err := inbox.RunBatch(h.cfg.Context, h.b.Inbox, keyed,
		func(msg jetstream.Msg) inbox.Event { return h.b.Event(msg, ids[msg]) }, h.b.Process)
	if p != nil {
		h.cfg.progress.Stop(&p.tick)
	}
	for n, msg := range keyed {
		if err != nil {
			h.cfg.apply(msg, h.cfg.Policy.FromInbox(nil, err, attempt(msg)))
			continue
		}
		h.cfg.apply(msg, h.cfg.Policy.FromInbox(results[n].Outcome, results[n].Err, attempt(msg)))
	}
}
