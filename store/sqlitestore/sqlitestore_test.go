package sqlitestore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/sqlitestore"
	"github.com/idemgo/idem/store/storetest"
)

func openAt(t testing.TB, path string) idem.Store {
	s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newStore(t testing.TB) idem.Store {
	return openAt(t, filepath.Join(t.TempDir(), "idem.db"))
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{Persistent: true, ListsRecords: true, Archives: true}, newStore)
}

func TestMultiProcess(t *testing.T) {
	storetest.MultiProcess(t, "TestMultiProcess", filepath.Join(t.TempDir(), "shared.db"), 4, 200, openAt)
}

func TestCrashTakeover(t *testing.T) {
	storetest.CrashTakeover(t, "TestCrashTakeover", filepath.Join(t.TempDir(), "crash.db"), openAt)
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, newStore)
}

func TestCampaign(t *testing.T) {
	loc := filepath.Join(t.TempDir(), "campaign.db")
	if storetest.IsChild() {
		loc = "" // the parent's location comes from the environment
	}
	storetest.Campaign(t, storetest.CampaignConfig{TestName: "TestCampaign", Location: loc, Open: openAt, Processes: 2})
}
