package memstore_test

import (
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/storetest"
)

func newStore(t testing.TB) idem.Store {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConformance runs the suite on the store's injected clock: the lease
// and retention cases advance it instead of sleeping.
func TestConformance(t *testing.T) {
	storetest.RunClocked(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, ListsRecords: true, Archives: true}, func(t testing.TB, clock idem.Clock) idem.Store {
		s := memstore.New(memstore.Config{Clock: clock})
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, newStore)
}

func TestCampaign(t *testing.T) {
	storetest.Campaign(t, storetest.CampaignConfig{TestName: "TestCampaign",
		Open: func(t testing.TB, _ string) idem.Store { return newStore(t) }})
}
