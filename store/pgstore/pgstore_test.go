package pgstore_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
)

func openAt(t testing.TB, schema string) idem.Store {
	return testenv.OpenPostgres(t, schema, pgstore.Config{})
}

func newStore(t testing.TB) idem.Store { return openAt(t, testenv.RandomName("idemtest_")) }

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{Persistent: true, ListsRecords: true, Archives: true}, newStore)
}

func TestConformancePgBouncerMode(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{Persistent: true, ListsRecords: true, Archives: true}, func(t testing.TB) idem.Store {
		return testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{PgBouncer: true})
	})
}

func TestExistingPool(t *testing.T) {
	testenv.ProbePostgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := testenv.RandomName("idemtest_")
	defer pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	s := pgstore.New(pool, schema, idem.Limits{})
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if _, err := s.Acquire(ctx, idem.AcquireRequest{Key: "k", Lease: time.Second, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("Close closed a pool it does not own: %v", err)
	}
}

func TestMultiProcess(t *testing.T) {
	testenv.ProbePostgres(t)
	storetest.MultiProcess(t, "TestMultiProcess", testenv.RandomName("idemtest_"), 4, 200, openAt)
}

func TestCrashTakeover(t *testing.T) {
	testenv.ProbePostgres(t)
	storetest.CrashTakeover(t, "TestCrashTakeover", testenv.RandomName("idemtest_"), openAt)
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, newStore)
}

// TestCampaign runs the fault campaign with every process reaching
// PostgreSQL through a TCP proxy that the campaign cuts now and then.
func TestCampaign(t *testing.T) {
	testenv.ProbePostgres(t)
	location := ""
	var cut, restore func()
	if !storetest.IsChild() {
		u, err := url.Parse(testenv.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		p := testenv.StartProxy(t, u.Host)
		u.Host = p.Addr()
		cut, restore = p.Cut, p.Restore
		location = testenv.RandomName("idemtest_") + " " + u.String()
	}
	open := func(t testing.TB, location string) idem.Store {
		schema, conn, _ := strings.Cut(location, " ")
		s, err := pgstore.Open(context.Background(), pgstore.Config{ConnString: conn, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !storetest.IsChild() {
				_, _ = s.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			}
			s.Close()
		})
		return s
	}
	storetest.Campaign(t, storetest.CampaignConfig{TestName: "TestCampaign", Location: location, Open: open,
		Processes: 2, Cut: cut, Restore: restore})
}
