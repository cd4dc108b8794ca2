package otelidem

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// Observer returns an observer recording into meters of mp.
func Observer(mp metric.MeterProvider) (func(idem.Event), error) {
	m := mp.Meter("github.com/idemgo/idem")
	acq, err1 := m.Int64Counter("idem.acquisitions", metric.WithDescription("Acquisitions by outcome; a duplicate is replayed, in-progress or a mismatch."))
	set, err2 := m.Int64Counter("idem.settlements", metric.WithDescription("Records settled after the work ran, by disposition (a settle that never reached the store is a store error, not a settlement)."))
	dur, err3 := m.Float64Histogram("idem.store.duration", metric.WithUnit("s"), metric.WithDescription("Store operation latency by phase."))
	errs, err4 := m.Int64Counter("idem.store.errors", metric.WithDescription("Failed store operations by phase (stale fences excluded)."))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	ctx := context.Background()
	return func(e idem.Event) {
		phase := metric.WithAttributes(attribute.String("phase", e.Phase))
		if e.Err != nil && !errors.Is(e.Err, store.ErrStaleFence) {
			errs.Add(ctx, 1, phase)
		}
		if !e.Cached && e.Duration > 0 {
			dur.Record(ctx, e.Duration.Seconds(), phase)
		}
		switch e.Phase {
		case "acquire":
			if e.Err == nil {
				acq.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", e.Outcome.String()), attribute.Bool("cached", e.Cached)))
			}
		case "settle":
			if e.Err == nil { // a settle tried again reports each try; only one settles
				set.Add(ctx, 1, metric.WithAttributes(attribute.String("disposition", e.Disposition.String())))
			}
		}
	}, nil
}
