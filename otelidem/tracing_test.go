package otelidem_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/otelidem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestTracing: a Run is a span in the caller's trace, the work's spans are
// its children, and its attributes say what happened; a duplicate's span
// says replayed, a failing run's span carries the error.
func TestTracing(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, err := idem.NewGuard(idem.Config{Store: s, Tracer: otelidem.Tracing(tp)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, request := tp.Tracer("test").Start(context.Background(), "POST /payments")
	key := idem.Key{Scope: "payments", ID: "PAY-1"}
	work := func(ctx context.Context, fence uint64) ([]byte, error) {
		_, span := tp.Tracer("test").Start(ctx, "charge card")
		span.End()
		return []byte("ok"), nil
	}
	for range 2 {
		if _, err := g.Run(ctx, key, nil, work); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Run(ctx, idem.Key{Scope: "payments", ID: "PAY-2"}, nil, func(context.Context, uint64) ([]byte, error) {
		return nil, errors.New("card declined")
	}); err == nil {
		t.Fatal("no error")
	}
	request.End()

	spans := exp.GetSpans().Snapshots()
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
		if s.SpanContext().TraceID() != request.SpanContext().TraceID() {
			t.Errorf("span %s is in another trace", s.Name())
		}
	}
	runs, charge := byName["idem.run"], byName["charge card"]
	if len(runs) != 3 || len(charge) != 1 {
		t.Fatalf("spans %v", byName)
	}
	first, replay, failed := attrs(runs[0]), attrs(runs[1]), attrs(runs[2])
	if first["idem.scope"].AsString() != "payments" || first["idem.outcome"].AsString() != "acquired" ||
		first["idem.disposition"].AsString() != "complete" || first["idem.fence"].AsInt64() == 0 || first["idem.attempt"].AsInt64() != 1 {
		t.Errorf("the first run's attributes: %v", first)
	}
	if runs[0].Parent().SpanID() != request.SpanContext().SpanID() || charge[0].Parent().SpanID() != runs[0].SpanContext().SpanID() {
		t.Error("the run is not the request's child, or the work's span not the run's")
	}
	if replay["idem.outcome"].AsString() != "replayed" {
		t.Errorf("the duplicate's attributes: %v", replay)
	}
	if failed["idem.disposition"].AsString() != "release" || runs[2].Status().Code != codes.Error || runs[2].Status().Description != "card declined" {
		t.Errorf("the failed run: %v, status %v", failed, runs[2].Status())
	}
}

// TestTracingSampledOut: with sampling off, the spans are not recorded and
// the Run works as without a tracer.
func TestTracingSampledOut(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.NeverSample()))
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, err := idem.NewGuard(idem.Config{Store: s, Tracer: otelidem.Tracing(tp)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := g.Run(context.Background(), idem.Key{Scope: "s", ID: "k"}, nil, func(context.Context, uint64) ([]byte, error) { return []byte("v"), nil })
	if err != nil || res.Outcome != store.Acquired || len(exp.GetSpans()) != 0 {
		t.Fatalf("%v %v, %d spans", res.Outcome, err, len(exp.GetSpans()))
	}
}

// BenchmarkTracing measures what tracing adds to a Guard lifecycle on the
// memory store: without a tracer, with one whose sampler records nothing,
// and with every span recorded (into an exporter that drops them).
func BenchmarkTracing(b *testing.B) {
	ns := map[string]float64{}
	for _, c := range []struct {
		name   string
		tracer func() idem.Tracer
	}{
		{"none", func() idem.Tracer { return nil }},
		{"sampled-out", func() idem.Tracer {
			return otelidem.Tracing(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))
		}},
		{"sampled", func() idem.Tracer {
			return otelidem.Tracing(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSyncer(tracetest.NewNoopExporter())))
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := memstore.New(memstore.Config{SweepInterval: -1})
			defer s.Close()
			g, err := idem.NewGuard(idem.Config{Store: s, Tracer: c.tracer(), Retention: time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			work := func(context.Context, uint64) ([]byte, error) { return []byte("ok"), nil }
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				if _, err := g.Run(ctx, idem.Key{Scope: "s", ID: strconv.Itoa(i % 65536)}, nil, work); err != nil {
					b.Fatal(err)
				}
			}
			ns[c.name] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
	}
	if ns["none"] > 0 && ns["sampled-out"] > 0 {
		b.Logf("tracing sampled out: %.2fx the lifecycle without a tracer; every span recorded: %.2fx", ns["sampled-out"]/ns["none"], ns["sampled"]/ns["none"])
	}
}
