package kafkaidem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/inbox"
)

// Headers kafkaidem reads and writes.
const (
	// KeyHeader is where the key is read from by default: the header
	// outbox/kafkasender writes its key into, the same on every attempt.
	KeyHeader = "Idempotency-Key"
	// ReasonHeader carries why a record was dead-lettered.
	ReasonHeader = "Idem-Reason"
	// The dead-letter copy's origin.
	OriginalTopicHeader     = "Idem-Original-Topic"
	OriginalPartitionHeader = "Idem-Original-Partition"
	OriginalOffsetHeader    = "Idem-Original-Offset"
)

// Config configures a Consumer.
type Config struct {
	// Scope names the consumer; keys are scoped by it. Required.
	Scope string
	// ClientOptions configure the franz-go client: the seed brokers, the
	// consumer group and the topics (kgo.SeedBrokers, kgo.ConsumerGroup,
	// kgo.ConsumeTopics) at least; a consumer group is required. The
	// Consumer adds its own commit options and partition callbacks, which
	// override any of the caller's (kgo.AutoCommitMarks,
	// kgo.BlockRebalanceOnPoll, kgo.OnPartitionsRevoked,
	// kgo.OnPartitionsLost). Marked offsets are committed every second
	// unless the options set kgo.AutoCommitInterval.
	ClientOptions []kgo.Opt
	// Key extracts the producer's id. Defaults to the KeyHeader header.
	Key broker.KeyFunc
	// Fingerprint tells payloads apart under one key (GuardConsumer).
	// Defaults to broker.BodyFingerprint; broker.NoFingerprint skips it.
	Fingerprint broker.FingerprintFunc
	// Policy sets the delays of the retries in place.
	Policy broker.Policy
	// DeadLetterTopic receives a copy of every record that is never to be
	// processed (no key, key reused with another payload, poisoned), with
	// ReasonHeader and the record's origin, before its offset is
	// committed. Defaults to the record's topic with ".DLT" appended. The
	// topic must exist (or the cluster create topics on use): until the
	// copy is acknowledged the record is retried in place and its offset
	// is not committed. The record's own Idem-* headers are not copied. A
	// copy the topic can never take (too large, or invalid) goes without
	// its value, the reason saying so.
	DeadLetterTopic string
	// Concurrency is how many records run at once, each of another
	// partition. Defaults to 1.
	Concurrency int
	// RevokeTimeout bounds how long a rebalance waits for the records in
	// flight on the partitions this consumer loses before it commits what
	// settled and lets them go. Defaults to 10s; keep it under the group's
	// rebalance timeout.
	RevokeTimeout time.Duration
	// MaxBuffered is how many fetched records a partition may hold before
	// its fetching pauses (resumed at half). Defaults to 500.
	MaxBuffered int
	// MaxBufferedBytes bounds the same by the records' size (keys, values
	// and headers): a partition's fetching pauses once it holds that many
	// bytes, and resumes at half. Defaults to 32 MiB.
	MaxBufferedBytes int
	// Context is the parent of every run's context. Defaults to
	// context.Background().
	Context context.Context
	// OnDecision, if set, hears every decision (for logs and metrics): an
	// Ack is committed, a Retry runs again in place, a DeadLetter was
	// produced to the dead-letter topic and is committed.
	OnDecision func(rec *kgo.Record, d broker.Decision)
	// TracerProvider, if set, traces each record: a span "process
	// <topic>" from its first try to its settled outcome (or to the
	// partition being let go), continuing the producer's trace from the
	// record's traceparent header; the Guard's or the inbox's work runs in
	// it.
	TracerProvider trace.TracerProvider
	// OnError, if set, hears the errors the consumer cannot act on: fetch
	// errors the client reports, failed commits (retried with the next
	// commit).
	OnError func(err error)
}

func (c *Config) validate() error {
	if c.Scope == "" {
		return errors.New("idem/kafkaidem: Config.Scope is required")
	}
	if c.Key == nil {
		c.Key = broker.HeaderKey(KeyHeader)
	}
	if c.Fingerprint == nil {
		c.Fingerprint = broker.BodyFingerprint
	}
	if c.Concurrency < 0 || c.MaxBuffered < 0 || c.MaxBufferedBytes < 0 || c.RevokeTimeout < 0 {
		return errors.New("idem/kafkaidem: Config.Concurrency, MaxBuffered, MaxBufferedBytes and RevokeTimeout must not be negative")
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.MaxBuffered == 0 {
		c.MaxBuffered = 500
	}
	if c.MaxBufferedBytes == 0 {
		c.MaxBufferedBytes = 32 << 20
	}
	if c.RevokeTimeout == 0 {
		c.RevokeTimeout = 10 * time.Second
	}
	if c.Context == nil {
		c.Context = context.Background()
	}
	return nil
}

// message is a record as the key extractors see it.
type message struct{ r *kgo.Record }

func (m message) Header(name string) string {
	for _, h := range m.r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

func (m message) Body() []byte { return m.r.Value }

// Record returns the Kafka record behind a message a KeyFunc or a
// FingerprintFunc is given by this package, or nil.
func Record(m broker.Message) *kgo.Record {
	if km, ok := m.(message); ok {
		return km.r
	}
	return nil
}

// OffsetKey keys a record by its topic, partition and offset. It
// deduplicates redeliveries of one record only (after a crash or a
// rebalance): a producer that sends a message again writes a new record at
// a new offset, which this key cannot tell from a new message. Prefer the
// producer's own key wherever it sends one.
func OffsetKey(m broker.Message) (string, error) {
	r := Record(m)
	if r == nil {
		return "", errors.New("idem/kafkaidem: OffsetKey needs a Kafka record")
	}
	return r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10), nil
}

var errNoGroup = errors.New("Config.ClientOptions must name a consumer group (kgo.ConsumerGroup)")

// Consumer consumes a consumer group's records through idem. Make it with
// GuardConsumer or InboxConsumer, and call Run.
type Consumer struct {
	cfg    Config
	cl     *kgo.Client
	decide func(ctx context.Context, rec *kgo.Record, id string, attempt int) broker.Decision
	slots  chan struct{}

	mu      sync.Mutex
	parts   map[topicPartition]*partition
	running atomic.Bool
}

type topicPartition struct {
	topic     string
	partition int32
}

// GuardConsumer returns a Consumer that runs work at most once per key
// through g. The fence is handed to work.
func GuardConsumer(g *idem.Guard, cfg Config, work func(ctx context.Context, rec *kgo.Record, fence uint64) ([]byte, error)) (*Consumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return newConsumer(cfg, func(ctx context.Context, rec *kgo.Record, id string, attempt int) broker.Decision {
		opts := idem.RunOptions{Fingerprint: cfg.Fingerprint(message{rec})}
		res, err := g.Run(ctx, idem.Key{Scope: cfg.Scope, ID: id}, &opts,
			func(ctx context.Context, fence uint64) ([]byte, error) { return work(ctx, rec, fence) })
		return cfg.Policy.FromGuard(res, err, attempt)
	})
}

// InboxConsumer returns a Consumer for the transactional inbox: process runs
// the business change and inbox.ClaimTx (or Process…) in one transaction,
// keyed by the id the Key function extracted. A failed transaction is
// retried in place; every outcome of the inbox is committed.
func InboxConsumer(cfg Config, process func(ctx context.Context, rec *kgo.Record, id string) (inbox.Outcome, error)) (*Consumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return newConsumer(cfg, func(ctx context.Context, rec *kgo.Record, id string, attempt int) broker.Decision {
		out, err := process(ctx, rec, id)
		return cfg.Policy.FromInbox(out, err, attempt)
	})
}

func newConsumer(cfg Config, decide func(ctx context.Context, rec *kgo.Record, id string, attempt int) broker.Decision) (*Consumer, error) {
	c := &Consumer{cfg: cfg, decide: decide, slots: make(chan struct{}, cfg.Concurrency), parts: map[topicPartition]*partition{}}
	opts := append([]kgo.Opt{kgo.AutoCommitInterval(time.Second)}, cfg.ClientOptions...)
	opts = append(opts,
		kgo.AutoCommitMarks(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
			c.letGo(ctx, revoked, true)
		}),
		kgo.OnPartitionsLost(func(ctx context.Context, cl *kgo.Client, lost map[string][]int32) {
			c.letGo(ctx, lost, false)
		}),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil && strings.Contains(err.Error(), "group was not specified") {
		err = errNoGroup
	}
	if err != nil {
		return nil, fmt.Errorf("idem/kafkaidem: %w", err)
	}
	if group, _ := cl.OptValue(kgo.ConsumerGroup).(string); group == "" {
		cl.Close()
		return nil, fmt.Errorf("idem/kafkaidem: %w", errNoGroup)
	}
	c.cl = cl
	return c, nil
}

// Client is the consumer's franz-go client: for producing, or for the admin
// requests of kadm. Do not poll or commit through it.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Run consumes until ctx ends, then stops taking records, waits up to
// RevokeTimeout for the records in flight, commits what settled, leaves the
// group and closes the client. It returns nil once the group was left; a
// Consumer runs once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("idem/kafkaidem: Run was called before")
	}
	for {
		fetches := c.cl.PollFetches(ctx)
		if fetches.IsClientClosed() {
			return errors.New("idem/kafkaidem: the client was closed")
		}
		if ctx.Err() != nil {
			c.cl.AllowRebalance()
			break
		}
		failed := false
		fetches.EachError(func(topic string, partition int32, err error) {
			failed = true
			if c.cfg.OnError != nil && !errors.Is(err, context.Canceled) {
				c.cfg.OnError(fmt.Errorf("idem/kafkaidem: fetching %s/%d: %w", topic, partition, err))
			}
		})
		fetches.EachPartition(c.dispatch)
		c.cl.AllowRebalance()
		if failed && fetches.NumRecords() == 0 {
			// Errors only (an unreachable cluster, a refused group): poll
			// again after a pause rather than spin.
			pause := time.NewTimer(250 * time.Millisecond)
			select {
			case <-pause.C:
			case <-ctx.Done():
				pause.Stop()
			}
		}
	}
	c.mu.Lock()
	all := map[string][]int32{}
	for tp := range c.parts {
		all[tp.topic] = append(all[tp.topic], tp.partition)
	}
	c.mu.Unlock()
	c.letGo(context.Background(), all, true)
	c.cl.Close()
	return nil
}

// dispatch queues a fetched partition's records for its worker, starting
// one on the partition's first records of an assignment. It runs between a
// poll and AllowRebalance: no rebalance runs meanwhile.
func (c *Consumer) dispatch(fp kgo.FetchTopicPartition) {
	if len(fp.Records) == 0 {
		return
	}
	tp := topicPartition{fp.Topic, fp.Partition}
	c.mu.Lock()
	p := c.parts[tp]
	if p == nil {
		p = &partition{c: c, tp: tp, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
		c.parts[tp] = p
		go p.run()
	}
	c.mu.Unlock()
	p.add(fp.Records)
}

// letGo stops the workers of partitions this consumer loses. For a
// revocation (commit) it waits up to RevokeTimeout for their records in
// flight and commits the offsets that settled; lost partitions (the
// session ended) are let go at once.
func (c *Consumer) letGo(ctx context.Context, tps map[string][]int32, commit bool) {
	var stopped []*partition
	resume := map[string][]int32{}
	c.mu.Lock()
	for topic, ps := range tps {
		for _, n := range ps {
			tp := topicPartition{topic, n}
			p := c.parts[tp]
			if p == nil {
				continue
			}
			delete(c.parts, tp)
			if p.stopTaking() {
				resume[topic] = append(resume[topic], n)
			}
			stopped = append(stopped, p)
		}
	}
	c.mu.Unlock()
	if len(resume) > 0 {
		c.cl.ResumeFetchPartitions(resume)
	}
	if !commit {
		return
	}
	bound := time.NewTimer(c.cfg.RevokeTimeout)
	defer bound.Stop()
wait:
	for _, p := range stopped {
		select {
		case <-p.done:
		case <-bound.C:
			break wait
		}
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.RevokeTimeout)
	defer cancel()
	if err := c.cl.CommitMarkedOffsets(cctx); err != nil && c.cfg.OnError != nil {
		c.cfg.OnError(fmt.Errorf("idem/kafkaidem: committing on revocation: %w", err))
	}
}

// handle runs one record to a settled outcome, retrying it in place; it
// returns false if the partition was let go before it settled.
func (c *Consumer) handle(p *partition, rec *kgo.Record) bool {
	id, keyErr := c.cfg.Key(message{rec})
	ctx := c.cfg.Context
	if c.cfg.TracerProvider != nil {
		var span trace.Span
		ctx, span = broker.StartConsume(ctx, c.cfg.TracerProvider, message{rec}, "kafka", rec.Topic, id)
		var last broker.Decision
		defer func() { broker.EndConsume(span, last) }()
		return c.tries(ctx, p, rec, id, keyErr, &last)
	}
	var last broker.Decision
	return c.tries(ctx, p, rec, id, keyErr, &last)
}

// tries runs rec until its outcome is settled (true) or the partition is
// let go (false); last is the last decision.
func (c *Consumer) tries(ctx context.Context, p *partition, rec *kgo.Record, id string, keyErr error, last *broker.Decision) bool {
	for attempt := 1; ; attempt++ {
		select {
		case c.slots <- struct{}{}:
		case <-p.stop:
			return false
		}
		var d broker.Decision
		if keyErr != nil {
			d = broker.Decision{Verdict: broker.DeadLetter, Reason: "no key: " + keyErr.Error()}
		} else {
			d = c.decide(ctx, rec, id, attempt)
		}
		if d.Verdict == broker.DeadLetter {
			reason, err := c.deadLetter(rec, d.Reason)
			if err != nil {
				d = broker.Decision{Verdict: broker.Retry, Delay: c.cfg.Policy.Backoff(attempt), Reason: "not dead-lettered: " + err.Error()}
			} else {
				d.Reason = reason
			}
		}
		<-c.slots
		*last = d
		if c.cfg.OnDecision != nil {
			c.cfg.OnDecision(rec, d)
		}
		if d.Verdict != broker.Retry {
			return true
		}
		wait := time.NewTimer(d.Delay)
		select {
		case <-wait.C:
		case <-p.stop:
			wait.Stop()
			return false
		}
	}
}

// deadLetter produces a copy of rec to the dead-letter topic and waits for
// the acknowledgement; it returns the reason the copy carries. A copy the
// topic can never take (too large for the broker or the client, or a record
// the broker calls invalid) is produced again without its value, the
// reason saying so: the partition never stops on one record.
func (c *Consumer) deadLetter(rec *kgo.Record, reason string) (string, error) {
	err := c.produceDeadLetter(rec, rec.Value, reason)
	if err != nil && (errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) || errors.Is(err, kerr.InvalidRecord)) {
		reason = fmt.Sprintf("%s; the value (%d bytes) was dropped: the dead-letter topic refused the copy: %v", reason, len(rec.Value), err)
		err = c.produceDeadLetter(rec, nil, reason)
	}
	return reason, err
}

// produceDeadLetter produces rec's copy with value. The record's own Idem-*
// headers are left out: a reader of the copy finds only idem's reason and
// origin, not ones a producer wrote.
func (c *Consumer) produceDeadLetter(rec *kgo.Record, value []byte, reason string) error {
	topic := c.cfg.DeadLetterTopic
	if topic == "" {
		topic = rec.Topic + ".DLT"
	}
	headers := make([]kgo.RecordHeader, 0, len(rec.Headers)+4)
	for _, h := range rec.Headers {
		if len(h.Key) < 5 || !strings.EqualFold(h.Key[:5], "idem-") {
			headers = append(headers, h)
		}
	}
	headers = append(headers,
		kgo.RecordHeader{Key: ReasonHeader, Value: []byte(reason)},
		kgo.RecordHeader{Key: OriginalTopicHeader, Value: []byte(rec.Topic)},
		kgo.RecordHeader{Key: OriginalPartitionHeader, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)},
		kgo.RecordHeader{Key: OriginalOffsetHeader, Value: strconv.AppendInt(nil, rec.Offset, 10)},
	)
	ctx, cancel := context.WithTimeout(c.cfg.Context, 30*time.Second)
	defer cancel()
	return c.cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: rec.Key, Value: value, Headers: headers}).FirstErr()
}

// partition is the worker of one assigned partition: it runs the
// partition's records in order, one at a time.
type partition struct {
	c    *Consumer
	tp   topicPartition
	wake chan struct{} // a record was queued
	stop chan struct{} // closed when the partition is let go
	done chan struct{} // closed when the worker ended

	mu      sync.Mutex
	queue   []*kgo.Record
	bytes   int // the queued records' size
	paused  bool
	stopped bool
}

// size is what a record counts against MaxBufferedBytes.
func size(rec *kgo.Record) int {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func (p *partition) add(recs []*kgo.Record) {
	p.mu.Lock()
	p.queue = append(p.queue, recs...)
	for _, rec := range recs {
		p.bytes += size(rec)
	}
	pause := !p.paused && (len(p.queue) >= p.c.cfg.MaxBuffered || p.bytes >= p.c.cfg.MaxBufferedBytes)
	if pause {
		p.paused = true
	}
	p.mu.Unlock()
	if pause {
		p.c.cl.PauseFetchPartitions(map[string][]int32{p.tp.topic: {p.tp.partition}})
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// stopTaking stops the worker from taking more records; it reports whether
// the partition's fetching was paused (for the caller to resume it).
func (p *partition) stopTaking() (paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	p.queue, p.bytes = nil, 0
	close(p.stop)
	paused, p.paused = p.paused, false
	return paused
}

// next takes the partition's next record, waiting for one; nil once the
// partition was let go.
func (p *partition) next() *kgo.Record {
	for {
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return nil
		}
		if len(p.queue) > 0 {
			rec := p.queue[0]
			p.queue[0] = nil
			p.queue = p.queue[1:]
			p.bytes -= size(rec)
			resume := p.paused && len(p.queue) <= p.c.cfg.MaxBuffered/2 && p.bytes <= p.c.cfg.MaxBufferedBytes/2
			if resume {
				p.paused = false
			}
			p.mu.Unlock()
			if resume {
				p.c.cl.ResumeFetchPartitions(map[string][]int32{p.tp.topic: {p.tp.partition}})
			}
			return rec
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-p.stop:
			return nil
		}
	}
}

// markEvery bounds how many settled records a partition's worker runs
// before it marks the last one for committing (it marks at once when it
// runs out of records).
const markEvery = 64

// run takes the partition's records in order and runs each to a settled
// outcome. It marks the last settled record for committing — settled in
// order, every record before it is settled too — every markEvery records,
// whenever the queue runs dry, and before it ends.
func (p *partition) run() {
	defer close(p.done)
	var settled *kgo.Record
	unmarked := 0
	defer func() {
		if settled != nil {
			p.c.cl.MarkCommitRecords(settled)
		}
	}()
	for {
		rec := p.next()
		if rec == nil || !p.c.handle(p, rec) {
			return
		}
		settled = rec
		if unmarked++; unmarked >= markEvery || p.drained() {
			p.c.cl.MarkCommitRecords(settled)
			settled, unmarked = nil, 0
		}
	}
}

func (p *partition) drained() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue) == 0
}
