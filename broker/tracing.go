package broker

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the adapters' spans.
const ScopeName = "github.com/idemgo/idem/broker"

// headerCarrier reads W3C trace context from a message's headers.
type headerCarrier struct{ m Message }

func (c headerCarrier) Get(key string) string { return c.m.Header(key) }
func (c headerCarrier) Set(string, string)    {}
func (c headerCarrier) Keys() []string        { return []string{"traceparent", "tracestate"} }

// StartConsume starts the span of processing one message, in an adapter
// whose configuration names a tracer provider: "process <destination>", a
// consumer span (OpenTelemetry's messaging conventions) whose parent is the
// producer's span, read from the message's traceparent and tracestate
// headers (the outbox relay writes them), so the consumer joins the
// producer's trace. End it with EndConsume.
func StartConsume(ctx context.Context, tp trace.TracerProvider, m Message, system, destination, key string) (context.Context, trace.Span) {
	ctx = propagation.TraceContext{}.Extract(ctx, headerCarrier{m})
	return tp.Tracer(ScopeName).Start(ctx, "process "+destination, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", system),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.destination.name", destination),
			attribute.String("messaging.message.id", key),
		))
}

// EndConsume ends a span StartConsume started with the decision taken.
func EndConsume(span trace.Span, d Decision) {
	span.SetAttributes(attribute.String("idem.verdict", d.Verdict.String()))
	if d.Reason != "" {
		span.SetAttributes(attribute.String("idem.reason", d.Reason))
	}
	if d.Verdict == DeadLetter {
		span.SetStatus(codes.Error, d.Reason)
	}
	span.End()
}
