package otelidem

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
)

// ScopeName is the instrumentation scope of idem's spans and meters.
const ScopeName = "github.com/idemgo/idem"

// Tracing returns an idem.Tracer over tp (use it as idem.Config.Tracer):
// every Run is a span "idem.run" — the work's spans its children — with
// the attributes
//
//	idem.scope        the key's scope (its id is not recorded: it may name a person)
//	idem.outcome      acquired, taken-over, in-progress, replayed, mismatch, poisoned
//	idem.fence        the owner's fencing token, when there is one
//	idem.disposition  complete, fail, release or hold, when the work ran
//	idem.attempt      the record's acquisitions so far
//	idem.cached       a replay answered by the in-process cache
//
// and an error status when Run returned an error.
func Tracing(tp trace.TracerProvider) idem.Tracer {
	return tracer{tp.Tracer(ScopeName)}
}

type tracer struct{ t trace.Tracer }

// endOnly ends a span that records nothing: ending one is a no-op.
func endOnly(idem.Result, error) {}

func (t tracer) Start(ctx context.Context, key idem.Key) (context.Context, func(idem.Result, error)) {
	ctx, span := t.t.Start(ctx, "idem.run")
	if !span.IsRecording() {
		return ctx, endOnly
	}
	return ctx, func(res idem.Result, err error) {
		attrs := make([]attribute.KeyValue, 0, 6)
		attrs = append(attrs, attribute.String("idem.scope", key.Scope))
		if res.Outcome != 0 {
			attrs = append(attrs, attribute.String("idem.outcome", res.Outcome.String()))
		}
		if res.Fence != 0 {
			attrs = append(attrs, attribute.Int64("idem.fence", int64(res.Fence)))
		}
		if res.Outcome.Owns() {
			attrs = append(attrs, attribute.String("idem.disposition", res.Disposition.String()))
		}
		if res.Record.Attempts > 0 {
			attrs = append(attrs, attribute.Int("idem.attempt", res.Record.Attempts))
		}
		if res.Cached {
			attrs = append(attrs, attribute.Bool("idem.cached", true))
		}
		span.SetAttributes(attrs...)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
