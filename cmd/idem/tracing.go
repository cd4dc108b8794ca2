package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem/otelidem"
)

// startTracing returns the tracer provider OpenTelemetry's environment asks
// for (otelidem.TracerProviderFromEnv: OTEL_EXPORTER_OTLP_ENDPOINT, …), or
// nil, and the function that flushes its last spans.
func startTracing(ctx context.Context, service string, log io.Writer) (trace.TracerProvider, func(), error) {
	tp, err := otelidem.TracerProviderFromEnv(ctx, service)
	if err != nil || tp == nil {
		return nil, func() {}, err
	}
	fmt.Fprintf(log, "%s: exporting traces over OTLP\n", service)
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx)
	}, nil
}

// w3c is what the commands read and write as trace context: W3C
// traceparent and tracestate.
var w3c propagation.TraceContext

// serverSpans runs next in a server span per request, continuing the
// caller's trace from its traceparent header (with tp nil, next alone).
func serverSpans(tp trace.TracerProvider, next http.Handler) http.Handler {
	if tp == nil {
		return next
	}
	t := tp.Tracer("github.com/idemgo/idem/cmd/idem")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := w3c.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.Start(ctx, r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
			attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

// statusWriter notes the status a handler wrote; Unwrap lets
// http.ResponseController reach the connection (flushes, deadlines).
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
