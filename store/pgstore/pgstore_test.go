package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/storetest"
	"github.com/idemgo/idem/store/storeurl"
)

func openAt(t testing.TB, schema string) store.Store {
	return testenv.OpenPostgres(t, schema, pgstore.Config{})
}

func newStore(t testing.TB) store.Store { return openAt(t, testenv.RandomName("idemtest_")) }

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, Persistent: true, ListsRecords: true, Archives: true}, newStore)
}

// TestConformanceThroughPgBouncer runs the suite through a real PgBouncer
// in transaction pooling mode (started by the test), with the store's
// PgBouncer option.
func TestConformanceThroughPgBouncer(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestConformance runs the suite; this runs it through PgBouncer")
	}
	bouncer := testenv.StartPgBouncer(t)
	storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, Persistent: true, ListsRecords: true, Archives: true}, func(t testing.TB) store.Store {
		return testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{ConnString: bouncer, PgBouncer: true})
	})
}

// TestConformanceWhereCommitsAreAsync runs the suite on a server whose
// default synchronous_commit is off, through pools of the user's: every
// write then carries the condition that raises it for its transaction
// (TestServerCrash shows what it is for); the outcomes must be the same.
func TestConformanceWhereCommitsAreAsync(t *testing.T) {
	srv := testenv.StartPostgres(t, "synchronous_commit=off")
	storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, Persistent: true, ListsRecords: true, Archives: true}, func(t testing.TB) store.Store {
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := pgstore.Open(ctx, pgstore.Config{Pool: pool, Schema: testenv.RandomName("idemtest_")})
		if err != nil {
			t.Fatal(err)
		}
		if !s.WritesDurably() {
			t.Fatal("the store's writes do not raise synchronous_commit on a server whose default is off")
		}
		return s
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
	if _, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Lease: time.Second, Retention: time.Hour}); err != nil {
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

// TestCampaign runs the fault campaign on a PostgreSQL server of the
// test's own, with every process reaching it through a TCP proxy that the
// campaign cuts and stalls now and then; now and then the campaign kills
// the server (SIGKILL) and starts it again.
func TestCampaign(t *testing.T) { storetest.Campaign(t, campaignConfig(t, "TestCampaign")) }

// TestGuardCampaign runs guarded work (idem.Guard) under the same faults.
func TestGuardCampaign(t *testing.T) {
	storetest.GuardCampaign(t, campaignConfig(t, "TestGuardCampaign"))
}

// campaignConfig: a PostgreSQL server of the test's own, which every
// process reaches through a TCP proxy that the campaign cuts and stalls now
// and then (the Guard campaign's direct workers without it), and which the
// campaign crashes now and then.
func campaignConfig(t *testing.T, name string) storetest.CampaignConfig {
	cfg := storetest.CampaignConfig{TestName: name, Processes: 2,
		Open: func(t testing.TB, location string) store.Store {
			return openThroughFaults(t, location, pgstore.Config{})
		}}
	if !storetest.IsChild() {
		srv := testenv.StartPostgres(t)
		p := testenv.StartProxy(t, srv.Addr())
		cfg.Cut, cfg.Restore, cfg.Stall, cfg.Unstall = p.Cut, p.Restore, p.Stall, p.Unstall
		cfg.Crash = func() { srv.Crash(t) }
		u, err := url.Parse(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		direct := u.String()
		u.Host = p.Addr()
		schema := testenv.RandomName("idemtest_")
		cfg.Location, cfg.Direct = schema+" "+u.String(), schema+" "+direct
	}
	return cfg
}

// openThroughFaults opens a campaign's store at location ("schema
// connstring"), on a server of the campaign's own: a worker started while
// the campaign cuts the server, or while PgBouncer refuses logins for a
// while after a crash (server_login_retry), finds its Open failing closed
// (ErrStoreUnavailable) and tries again, for up to 10 s.
func openThroughFaults(t testing.TB, location string, cfg pgstore.Config) store.Store {
	cfg.Schema, cfg.ConnString, _ = strings.Cut(location, " ")
	var s *pgstore.Store
	testenv.Eventually(t, 10*time.Second, "open the store", func() (err error) {
		s, err = pgstore.Open(context.Background(), cfg)
		if err != nil && !errors.Is(err, store.ErrUnavailable) {
			t.Fatal(err)
		}
		return err
	})
	t.Cleanup(func() { s.Close() })
	return s
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
	_, err := s.Acquire(context.Background(), store.AcquireRequest{Key: "k", Lease: time.Second, Retention: time.Hour})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("err = %v, want a *pgconn.PgError 42P01 in the chain", err)
	}
	if errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a missing table reported as unavailable: %v", err)
	}
}

// TestCampaignThroughPgBouncer runs the fault campaign through a real
// PgBouncer in transaction pooling mode, the connection to it cut now and
// then through a proxy, in front of a PostgreSQL server of the test's own
// whose default synchronous_commit is off (so every write raises it for
// its own transaction) and which the campaign crashes now and then.
func TestCampaignThroughPgBouncer(t *testing.T) {
	cfg := storetest.CampaignConfig{TestName: "TestCampaignThroughPgBouncer", Processes: 2,
		Open: func(t testing.TB, location string) store.Store {
			return openThroughFaults(t, location, pgstore.Config{PgBouncer: true})
		}}
	if !storetest.IsChild() {
		srv := testenv.StartPostgres(t, "synchronous_commit=off")
		bouncer := srv.PgBouncer(t)
		u, err := url.Parse(bouncer)
		if err != nil {
			t.Fatal(err)
		}
		p := testenv.StartProxy(t, u.Host)
		cfg.Cut, cfg.Restore, cfg.Stall, cfg.Unstall = p.Cut, p.Restore, p.Stall, p.Unstall
		cfg.Crash = func() { srv.Crash(t) }
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

// TestConformanceUncoalesced runs the suite with every call its own
// statement (Config.NoCoalesce).
func TestConformanceUncoalesced(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestConformance runs the suite; this runs it uncoalesced")
	}
	storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, Persistent: true, ListsRecords: true, Archives: true}, func(t testing.TB) store.Store {
		return testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{NoCoalesce: true})
	})
}

// TestCoalescedStatementsCarryManyCalls: 16 goroutines running lifecycles
// share statements, and every lifecycle ends as it would alone.
func TestCoalescedStatementsCarryManyCalls(t *testing.T) {
	s := newStore(t).(*pgstore.Store)
	testenv.CompleteMany(t, s, 64*40, func(i int) string { return fmt.Sprintf("many-%d", i) })
	statements, calls := s.CoalesceStats()
	t.Logf("%d shared statements carried %d calls", statements, calls)
	if statements == 0 || calls < 2*statements {
		t.Fatalf("16 goroutines at once shared %d statements carrying %d calls", statements, calls)
	}
}

// TestBatchSettleOfAGoneKey: a batch settling a key that was deleted (or
// swept) meanwhile reports a stale fence, and the key stays absent: Get
// finds nothing, List skips it, and the next Acquire takes it afresh with a
// greater fence.
func TestBatchSettleOfAGoneKey(t *testing.T) {
	s := newStore(t).(*pgstore.Store)
	ctx := context.Background()
	var fences []uint64
	for _, k := range []string{"gone", "kept"} {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		fences = append(fences, a.Fence)
	}
	if err := s.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	errs := pgstore.CompleteBatch(ctx, s, []string{"gone", "kept"}, fences, []byte("done"))
	if !errors.Is(errs[0], store.ErrStaleFence) || errs[1] != nil {
		t.Fatalf("settles: %v", errs)
	}
	if _, err := s.Get(ctx, "gone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of the gone key: %v", err)
	}
	if recs, err := s.List(ctx, "", 10); err != nil || len(recs) != 1 || recs[0].Key != "kept" {
		t.Fatalf("List: %+v %v", recs, err)
	}
	if n, err := s.CountStates(ctx); err != nil || n[store.StateCompleted] != 1 || len(n) != 1 {
		t.Fatalf("CountStates: %v %v", n, err)
	}
	a, err := s.Acquire(ctx, store.AcquireRequest{Key: "gone", Fingerprint: "other", Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != store.Acquired || a.Fence <= fences[0] {
		t.Fatalf("acquire after: %+v %v (old fence %d)", a, err, fences[0])
	}
}
