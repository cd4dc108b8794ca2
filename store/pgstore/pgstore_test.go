package pgstore_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
	"github.com/idemgo/idem/store/storeurl"
)

func openAt(t testing.TB, schema string) idem.Store {
	return testenv.OpenPostgres(t, schema, pgstore.Config{})
}

func newStore(t testing.TB) idem.Store { return openAt(t, testenv.RandomName("idemtest_")) }

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{Persistent: true, ListsRecords: true, Archives: true}, newStore)
}

// TestConformanceThroughPgBouncer runs the suite through a real PgBouncer
// in transaction pooling mode (started by the test), with the store's
// PgBouncer option.
func TestConformanceThroughPgBouncer(t *testing.T) {
	bouncer := testenv.StartPgBouncer(t)
	storetest.Run(t, storetest.Capabilities{Persistent: true, ListsRecords: true, Archives: true}, func(t testing.TB) idem.Store {
		return testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{ConnString: bouncer, PgBouncer: true})
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
	if _, err := pgstore.New(pgstore.Config{Schema: schema}); err == nil {
		t.Fatal("New without a pool was accepted")
	}
	s, err := pgstore.New(pgstore.Config{Pool: pool, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
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
	cfg := storetest.CampaignConfig{TestName: "TestCampaign", Processes: 2,
		Open: func(t testing.TB, location string) idem.Store {
			schema, conn, _ := strings.Cut(location, " ")
			return testenv.OpenPostgres(t, schema, pgstore.Config{ConnString: conn})
		}}
	if !storetest.IsChild() {
		conn, p := testenv.PostgresProxy(t)
		cfg.Cut, cfg.Restore = p.Cut, p.Restore
		cfg.Location = testenv.RandomName("idemtest_") + " " + conn
	}
	storetest.Campaign(t, cfg)
}

// TestUpgradeFromFirstRelease: a schema made by the first release (no
// idem_migrations) is adopted as version 1, and its records stay readable.
func TestUpgradeFromFirstRelease(t *testing.T) {
	testenv.ProbePostgres(t)
	ctx := context.Background()
	schema := testenv.RandomName("idemtest_")
	conn, err := pgx.Connect(ctx, testenv.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tbl := pgx.Identifier{schema, "idem_records"}.Sanitize()
	for _, q := range []string{
		`CREATE SCHEMA ` + pgx.Identifier{schema}.Sanitize(),
		`CREATE TABLE IF NOT EXISTS ` + tbl + ` (k text PRIMARY KEY, state smallint NOT NULL, fence bigint NOT NULL,
			fp text NOT NULL DEFAULT '', attempts integer NOT NULL, result bytea, lease_until timestamptz NOT NULL,
			expires_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, outcome smallint NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS idem_records_expires_at ON ` + tbl + ` (expires_at)`,
		`INSERT INTO ` + tbl + ` VALUES ('old', 2, 7, 'fp', 1, 'kept', now(), now() + interval '1 day', now(), 1)`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	s := testenv.OpenPostgres(t, schema, pgstore.Config{})
	rec, err := s.Get(ctx, "old")
	if err != nil || string(rec.Result) != "kept" || rec.Fence != 7 {
		t.Fatalf("record of the first release: %+v, %v", rec, err)
	}
	var versions int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "idem_migrations"}.Sanitize()+` WHERE component = 'records'`).Scan(&versions); err != nil || versions != len(s.Migrations()) {
		t.Fatalf("recorded versions: %d, %v", versions, err)
	}
}

// TestSchemaErrorsKeepTheirCause: a missing table is not "unavailable" (a
// retry will not help), and pgx's error stays reachable with errors.As.
func TestSchemaErrorsKeepTheirCause(t *testing.T) {
	testenv.ProbePostgres(t)
	schema := testenv.RandomName("idemtest_")
	s := testenv.OpenPostgres(t, schema, pgstore.Config{})
	if _, err := s.Pool().Exec(context.Background(), `DROP TABLE `+s.Table()); err != nil {
		t.Fatal(err)
	}
	_, err := s.Acquire(context.Background(), idem.AcquireRequest{Key: "k", Lease: time.Second, Retention: time.Hour})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("err = %v, want a *pgconn.PgError 42P01 in the chain", err)
	}
	if errors.Is(err, idem.ErrStoreUnavailable) {
		t.Fatalf("a missing table reported as unavailable: %v", err)
	}
}

// TestCampaignThroughPgBouncer runs the fault campaign through a real
// PgBouncer in transaction pooling mode, the connection to it cut now and
// then through a proxy.
func TestCampaignThroughPgBouncer(t *testing.T) {
	cfg := storetest.CampaignConfig{TestName: "TestCampaignThroughPgBouncer", Processes: 2,
		Open: func(t testing.TB, location string) idem.Store {
			schema, conn, _ := strings.Cut(location, " ")
			return testenv.OpenPostgres(t, schema, pgstore.Config{ConnString: conn, PgBouncer: true})
		}}
	if !storetest.IsChild() {
		bouncer := testenv.StartPgBouncer(t)
		u, err := url.Parse(bouncer)
		if err != nil {
			t.Fatal(err)
		}
		p := testenv.StartProxy(t, u.Host)
		cfg.Cut, cfg.Restore = p.Cut, p.Restore
		cfg.Location = testenv.RandomName("idemtest_") + " " + strings.Replace(bouncer, u.Host, p.Addr(), 1)
	}
	storetest.Campaign(t, cfg)
}

// TestPoolSize: without pool_max_conns in the URL, Open sizes the pool to
// Config.MaxConns, else to DefaultMaxConns; the URL's own setting wins;
// storeurl passes its Concurrency on.
func TestPoolSize(t *testing.T) {
	testenv.ProbePostgres(t)
	ctx := context.Background()
	for _, c := range []struct {
		url  string
		max  int32
		want int32
	}{
		{testenv.PostgresURL, 0, pgstore.DefaultMaxConns()},
		{testenv.PostgresURL, 32, 32},
		{testenv.PostgresURL + "&pool_max_conns=3", 32, 3},
	} {
		s, err := pgstore.Open(ctx, pgstore.Config{ConnString: c.url, MaxConns: c.max, SkipMigrate: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.PoolSize(); got != c.want {
			t.Errorf("%s, MaxConns %d: a pool of %d, want %d", c.url, c.max, got, c.want)
		}
		s.Close()
	}
	if pgstore.DefaultMaxConns() < 8 {
		t.Fatalf("DefaultMaxConns %d, want at least 8", pgstore.DefaultMaxConns())
	}
	s, err := storeurl.Open(ctx, testenv.PostgresURL, &storeurl.Options{Concurrency: 17, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.(*pgstore.Store).PoolSize(); got != 17 {
		t.Fatalf("storeurl with Concurrency 17: a pool of %d", got)
	}
}
