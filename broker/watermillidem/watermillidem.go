package watermillidem

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/store"
)

// ErrInProgress is returned (so the message is nacked) when another consumer
// is processing the same key.
var ErrInProgress = errors.New("idem/watermillidem: the key is in progress elsewhere")

// ErrRejected is returned for a message that must not be processed (key
// reused with another payload, or poisoned): route it with Watermill's
// PoisonQueue middleware, placed outside this one.
var ErrRejected = errors.New("idem/watermillidem: message rejected")

type msg struct{ m *message.Message }

func (w msg) Header(name string) string { return w.m.Metadata.Get(name) }
func (w msg) Body() []byte              { return w.m.Payload }

// Middleware returns the middleware. Keys are scoped by scope and extracted by
// key from the metadata or the payload (broker.HeaderKey, broker.JSONKey).
// The handler's m.Context() is the guard's while it runs: idem.FenceFrom
// gives the fencing token, and it is cancelled if the lease is lost.
// Messages the handler produces on the first run are not replayed to
// duplicates: they were published already.
func Middleware(g *idem.Guard, scope string, key broker.KeyFunc, opts ...Option) (message.HandlerMiddleware, error) {
	if g == nil || scope == "" || key == nil {
		return nil, errors.New("idem/watermillidem: a guard, a scope and a key function are required")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		run := guarded(g, scope, h)
		if o.tp == nil {
			return func(m *message.Message) ([]*message.Message, error) { return run(m.Context(), m, key) }
		}
		return func(m *message.Message) ([]*message.Message, error) {
			id, _ := key(msg{m})
			ctx, span := broker.StartConsume(m.Context(), o.tp, msg{m}, "watermill", message.SubscribeTopicFromCtx(m.Context()), id)
			out, err := run(ctx, m, key)
			d := broker.Decision{Verdict: broker.Ack}
			switch {
			case errors.Is(err, ErrRejected):
				d = broker.Decision{Verdict: broker.DeadLetter, Reason: err.Error()}
			case err != nil:
				d = broker.Decision{Verdict: broker.Retry, Reason: err.Error()}
			}
			broker.EndConsume(span, d)
			return out, err
		}
	}, nil
}

// Option configures Middleware.
type Option func(*options)

type options struct{ tp trace.TracerProvider }

// WithTracerProvider traces each message: a span "process <topic>"
// continuing the producer's trace from the message's traceparent
// metadata, the Guard's run and the handler inside it.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// guarded runs h for a message through g, in ctx.
func guarded(g *idem.Guard, scope string, h message.HandlerFunc) func(ctx context.Context, m *message.Message, key broker.KeyFunc) ([]*message.Message, error) {
	return func(ctx context.Context, m *message.Message, key broker.KeyFunc) ([]*message.Message, error) {
		id, err := key(msg{m})
		if err != nil {
			return nil, fmt.Errorf("%w: no key: %v", ErrRejected, err)
		}
		var produced []*message.Message
		res, err := g.Run(ctx, idem.Key{Scope: scope, ID: id}, &idem.RunOptions{Fingerprint: idem.Fingerprint(m.Payload)},
			func(ctx context.Context, fence uint64) ([]byte, error) {
				// The handler runs in the guard's context: the fence
				// (idem.FenceFrom) and a cancellation when the lease is
				// lost. The message's own context comes back after.
				orig := m.Context()
				m.SetContext(ctx)
				defer m.SetContext(orig)
				out, err := h(m)
				produced = out
				return nil, err
			})
		if err != nil {
			return nil, err // the handler's error (key released) or the store's: nack
		}
		switch res.Outcome {
		case store.Acquired, store.TakenOver:
			return produced, nil
		case store.Replayed:
			return nil, nil // done before (or failed definitely, recorded): ack
		case store.InProgress:
			return nil, ErrInProgress
		default:
			return nil, fmt.Errorf("%w: %s", ErrRejected, res.Outcome)
		}
	}
}
