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

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{ListsRecords: true, Archives: true}, newStore)
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, newStore)
}

func TestCampaign(t *testing.T) {
	storetest.Campaign(t, storetest.CampaignConfig{TestName: "TestCampaign",
		Open: func(t testing.TB, _ string) idem.Store { return newStore(t) }})
}
