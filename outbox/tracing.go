package outbox

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the relay's spans.
const ScopeName = "github.com/idemgo/idem/outbox"

// w3c reads and writes W3C trace context (traceparent, tracestate): what
// the rows record and the messages carry, whatever propagator the
// application set globally.
var w3c propagation.TraceContext

// traceContextOf is the W3C trace context of ctx's span as a JSON object,
// or "" when ctx has none.
func traceContextOf(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	w3c.Inject(ctx, carrier)
	b, err := json.Marshal(carrier)
	if err != nil {
		return ""
	}
	return string(b)
}

// extractTraceContext returns ctx with the remote span context recorded
// in stored (traceContextOf's form), if any.
func extractTraceContext(ctx context.Context, stored string) context.Context {
	if stored == "" {
		return ctx
	}
	carrier := propagation.MapCarrier{}
	if json.Unmarshal([]byte(stored), &carrier) != nil {
		return ctx
	}
	return w3c.Extract(ctx, carrier)
}

// injectTraceContext writes ctx's span context into headers (traceparent,
// tracestate), replacing any the message had.
func injectTraceContext(ctx context.Context, headers map[string]string) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		w3c.Inject(ctx, propagation.MapCarrier(headers))
	}
}

// startSendSpan starts the span of one send of c: a child of the span
// that enqueued it (in ctx, if any), linked to it, with OpenTelemetry's
// messaging attributes (an HTTP or AS2 send is a client span).
func startSendSpan(ctx context.Context, tp trace.TracerProvider, c *claimed) (context.Context, trace.Span) {
	system, name := destinationName(c.Destination)
	kind := trace.SpanKindProducer
	if system == "" {
		kind = trace.SpanKindClient
	}
	attrs := []attribute.KeyValue{
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.operation.name", "send"),
		attribute.String("messaging.destination.name", name),
		attribute.String("messaging.message.id", c.Key),
		attribute.Int("idem.outbox.attempt", c.Tries+1),
	}
	if system != "" {
		attrs = append(attrs, attribute.String("messaging.system", system))
	}
	if c.OrderingKey != "" {
		attrs = append(attrs, attribute.String("idem.outbox.ordering_key", c.OrderingKey))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(attrs...)}
	if enqueued := trace.SpanContextFromContext(ctx); enqueued.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: enqueued,
			Attributes: []attribute.KeyValue{attribute.String("idem.link", "enqueued")}}))
	}
	return tp.Tracer(ScopeName).Start(ctx, "send "+name, opts...)
}

// endSendSpan ends a send's span with its result.
func endSendSpan(span trace.Span, res Result) {
	span.SetAttributes(attribute.String("idem.outbox.result", string(res.Status)))
	if res.Status != Sent && res.Status != Acked {
		msg := string(res.Status)
		if res.Err != nil {
			msg = res.Err.Error()
		}
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}

// destinationName returns the messaging system of a destination (""
// for HTTP and AS2) and its name as OpenTelemetry's conventions name a
// destination: the subject, the exchange or queue, the topic, the host.
func destinationName(dest string) (system, name string) {
	u, err := url.Parse(dest)
	if err != nil {
		return "", "unknown"
	}
	switch strings.ToLower(u.Scheme) {
	case "nats":
		return "nats", strings.TrimPrefix(u.Path, "/")
	case "amqp", "amqps":
		q := u.Query()
		if ex := q.Get("exchange"); ex != "" {
			return "rabbitmq", ex
		}
		return "rabbitmq", q.Get("routing_key")
	case "kafka":
		_, topic, _ := strings.Cut(strings.TrimPrefix(dest, "kafka://"), "/")
		return "kafka", topic
	case "sqs":
		return "aws_sqs", u.Host
	}
	return "", u.Host
}
