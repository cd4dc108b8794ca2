package otelidem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/otelidem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

func TestObserverRecordsOutcomes(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := otelidem.Observer(mp)
	if err != nil {
		t.Fatal(err)
	}
	m := memstore.New(memstore.Config{})
	defer m.Close()
	s := &completeFailsOnce{Store: m}
	g, _ := idem.NewGuard(idem.Config{Store: s, Observer: obs})
	ctx := context.Background()
	key := idem.Key{Scope: "t", ID: "1"}
	work := func(ctx context.Context, fence uint64) ([]byte, error) { return []byte("ok"), nil }
	g.Run(ctx, key, nil, work)
	g.Run(ctx, key, nil, work)
	g.Run(ctx, idem.Key{Scope: "t", ID: "2"}, nil, func(ctx context.Context, fence uint64) ([]byte, error) { return nil, errors.New("transient") })

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	var durations uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					for _, kv := range p.Attributes.ToSlice() {
						if kv.Key == "outcome" || kv.Key == "disposition" {
							counts[m.Name+"/"+kv.Value.AsString()] += p.Value
						}
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if v, ok := p.Attributes.Value(attribute.Key("phase")); ok && v.AsString() == "acquire" {
						durations += p.Count
					}
				}
			}
		}
	}
	// The completion's first try failed (a store error), its second
	// settled: one settlement.
	want := map[string]int64{"idem.acquisitions/acquired": 2, "idem.acquisitions/replayed": 1,
		"idem.settlements/complete": 1, "idem.settlements/release": 1}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, counts[k], v, counts)
		}
	}
	if durations != 3 {
		t.Errorf("%d acquire durations recorded, want 3", durations)
	}
}

// completeFailsOnce fails the first Complete as a store out of reach does.
type completeFailsOnce struct {
	store.Store
	failed bool
}

func (s *completeFailsOnce) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	if !s.failed {
		s.failed = true
		return idem.ErrStoreUnavailable
	}
	return s.Store.Complete(ctx, key, fence, result, retention)
}
