// Package lambdaidem makes AWS Lambda functions fed by SQS idempotent: each
// record of a batch runs through idem's Guard (GuardSQS) or the
// transactional inbox (InboxSQS) under the producer's key, and the handler
// answers with the records that must come back — partial batch responses
// (the event source mapping's ReportBatchItemFailures): a duplicate or a
// completed record is never retried, and one failing record does not send
// the whole batch back.
//
// A record comes back (is in BatchItemFailures) when it did not settle: its
// work failed in a way that may be retried, its key is in progress in
// another invocation, or the invocation ran out of time before it. A record
// to dead-letter — without a key, its key used with another payload,
// poisoned — comes back too, without running: the queue's redrive policy
// moves it to its dead-letter queue once it was received maxReceiveCount
// times (give the queue one).
//
// # The lease and the deadline
//
// An invocation that times out is stopped where it stands: it cannot
// settle or release the keys it holds. If a claim outlived it, every
// redelivery of those records would meet them "in progress" until the lease
// ran out — the failure Powertools for AWS Lambda (Python) users met when
// its in-progress records outlived a timed-out invocation by their
// expiry. Here every claim's lease ends at the invocation's deadline plus
// Config.LeaseMargin (idem.RunOptions.LeaseDeadline), whatever the Guard's
// Lease; the work's context ends Config.ReturnBefore ahead of the deadline,
// so that the handler still answers with the records that did not finish.
// Keep the queue's visibility timeout above the function's timeout (AWS
// asks for six times it): a record sent back is received again after it,
// by when its claim has ended.
//
// On a FIFO queue (an event source ARN ending in .fifo) records run one at
// a time, in order; after the first that must come back, the rest of the
// batch comes back with it unrun, so that the order holds.
package lambdaidem

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/inbox"
)

// Message attributes, as outbox/sqssender and broker/sqsidem name them.
const (
	// KeyAttribute carries the producer's key (the default Config.Key).
	KeyAttribute = "Idempotency-Key"
	// EncodingAttribute is "base64" on a record whose body is its payload
	// in standard base64; Record.Data is then the decoded payload.
	EncodingAttribute = "Idem-Body-Encoding"
)

// Record is one record of an SQS event with its payload.
type Record struct {
	events.SQSMessage
	// Data is the payload: the body, decoded where EncodingAttribute says
	// it is base64.
	Data []byte
}

// Header returns the string value of a message attribute ("" when
// absent); it makes a Record a broker.Message.
func (r *Record) Header(name string) string {
	if a, ok := r.MessageAttributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// Body returns Data.
func (r *Record) Body() []byte { return r.Data }

// Config configures a handler.
type Config struct {
	// Scope names the consumer; keys are scoped by it. Required.
	Scope string
	// Key extracts the producer's id. Defaults to the KeyAttribute message
	// attribute.
	Key broker.KeyFunc
	// Fingerprint tells payloads apart under one key (GuardSQS). Defaults
	// to broker.BodyFingerprint; broker.NoFingerprint skips it.
	Fingerprint broker.FingerprintFunc
	// Concurrency is how many records of a standard queue's batch run at
	// once. Defaults to 1.
	Concurrency int
	// LeaseMargin is how long past the invocation's deadline a claim may
	// live: the time its last heartbeat takes to reach the store. Defaults
	// to 1s.
	LeaseMargin time.Duration
	// ReturnBefore is how long before the invocation's deadline the work's
	// context ends, and no record starts: the time the handler needs to
	// answer. Defaults to 500ms.
	ReturnBefore time.Duration
	// OnDecision, if set, hears every record's decision (for logs and
	// metrics): Ack for a settled record, Retry or DeadLetter for one that
	// comes back.
	OnDecision func(r *Record, d broker.Decision)
}

func (c *Config) validate() error {
	if c.Scope == "" {
		return errors.New("idem/lambdaidem: Config.Scope is required")
	}
	if c.Key == nil {
		c.Key = broker.HeaderKey(KeyAttribute)
	}
	if c.Fingerprint == nil {
		c.Fingerprint = broker.BodyFingerprint
	}
	if c.Concurrency < 0 || c.LeaseMargin < 0 || c.ReturnBefore < 0 {
		return errors.New("idem/lambdaidem: Config.Concurrency, LeaseMargin and ReturnBefore must not be negative")
	}
	c.Concurrency = max(c.Concurrency, 1)
	if c.LeaseMargin == 0 {
		c.LeaseMargin = time.Second
	}
	if c.ReturnBefore == 0 {
		c.ReturnBefore = 500 * time.Millisecond
	}
	return nil
}

// Handler is an SQS-triggered Lambda function's handler: pass it to
// lambda.Start.
type Handler func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error)

// decideFunc runs one record of key id.
type decideFunc func(ctx context.Context, r *Record, id string, leaseDeadline time.Time) broker.Decision

// GuardSQS returns a handler that runs work at most once per key through
// g. The fence is handed to work.
func GuardSQS(g *idem.Guard, cfg Config, work func(ctx context.Context, r *Record, fence uint64) ([]byte, error)) (Handler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var policy broker.Policy
	return cfg.handler(func(ctx context.Context, r *Record, id string, leaseDeadline time.Time) broker.Decision {
		opts := idem.RunOptions{Fingerprint: cfg.Fingerprint(r), LeaseDeadline: leaseDeadline}
		res, err := g.Run(ctx, idem.Key{Scope: cfg.Scope, ID: id}, &opts,
			func(ctx context.Context, fence uint64) ([]byte, error) { return work(ctx, r, fence) })
		return policy.FromGuard(res, err, 1)
	}), nil
}

// InboxSQS returns a handler for the transactional inbox: process runs the
// business change and inbox.ClaimTx (or Process…) in one transaction,
// keyed by the id the Key function extracted.
func InboxSQS(cfg Config, process func(ctx context.Context, r *Record, id string) (inbox.Outcome, error)) (Handler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var policy broker.Policy
	return cfg.handler(func(ctx context.Context, r *Record, id string, _ time.Time) broker.Decision {
		out, err := process(ctx, r, id)
		return policy.FromInbox(out, err, 1)
	}), nil
}

func (c *Config) handler(decide decideFunc) Handler {
	return func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		workCtx, leaseDeadline := ctx, time.Time{}
		if d, ok := ctx.Deadline(); ok {
			var cancel context.CancelFunc
			workCtx, cancel = context.WithDeadline(ctx, d.Add(-c.ReturnBefore))
			defer cancel()
			leaseDeadline = d.Add(c.LeaseMargin)
		}
		back := make([]bool, len(ev.Records))
		one := func(i int) bool {
			if workCtx.Err() != nil {
				c.decided(&Record{SQSMessage: ev.Records[i]}, broker.Decision{Verdict: broker.Retry, Reason: "the invocation ran out of time before it"})
				back[i] = true
				return false
			}
			back[i] = !c.one(workCtx, decide, &ev.Records[i], leaseDeadline)
			return !back[i]
		}
		if len(ev.Records) > 0 && strings.HasSuffix(ev.Records[0].EventSourceARN, ".fifo") {
			for i := range ev.Records {
				if !one(i) {
					for j := i + 1; j < len(ev.Records); j++ {
						back[j] = true // behind a record that comes back: in order, after it
					}
					break
				}
			}
		} else {
			var wg sync.WaitGroup
			slots := make(chan struct{}, c.Concurrency)
			for i := range ev.Records {
				slots <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-slots; wg.Done() }()
					one(i)
				}()
			}
			wg.Wait()
		}
		var resp events.SQSEventResponse
		for i, b := range back {
			if b {
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: ev.Records[i].MessageId})
			}
		}
		return resp, nil
	}
}

// one runs a record and reports whether it settled.
func (c *Config) one(ctx context.Context, decide decideFunc, m *events.SQSMessage, leaseDeadline time.Time) bool {
	r := &Record{SQSMessage: *m, Data: []byte(m.Body)}
	if a, ok := m.MessageAttributes[EncodingAttribute]; ok && a.StringValue != nil && *a.StringValue == "base64" {
		data, err := base64.StdEncoding.DecodeString(m.Body)
		if err != nil {
			return c.decided(r, broker.Decision{Verdict: broker.DeadLetter, Reason: fmt.Sprintf("the body is not the base64 its %s attribute says: %v", EncodingAttribute, err)})
		}
		r.Data = data
	}
	id, err := c.Key(r)
	if err != nil {
		return c.decided(r, broker.Decision{Verdict: broker.DeadLetter, Reason: "no key: " + err.Error()})
	}
	return c.decided(r, decide(ctx, r, id, leaseDeadline))
}

// decided reports d and whether the record settled.
func (c *Config) decided(r *Record, d broker.Decision) bool {
	if c.OnDecision != nil {
		c.OnDecision(r, d)
	}
	return d.Verdict == broker.Ack
}
