package mysqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/mysqlstore"
	"github.com/idemgo/idem/store/storetest"
)

var caps = storetest.Capabilities{Unclaims: true, FencedDeletes: true, Persistent: true, ListsRecords: true}

// open opens a store at the mysql:// URL location.
func open(t testing.TB, location string, cfg mysqlstore.Config) *mysqlstore.Store {
	t.Helper()
	cfg.DSN = location
	s, err := mysqlstore.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func openAt(t testing.TB, location string) store.Store { return open(t, location, mysqlstore.Config{}) }

func newStore(t testing.TB) store.Store { return openAt(t, testenv.MySQLDatabase(t, "")) }

// TestConformance runs the suite on the store's injected clock: the lease
// and retention cases advance it instead of sleeping.
func TestConformance(t *testing.T) {
	storetest.RunClocked(t, caps, func(t testing.TB, clock idem.Clock) store.Store {
		return open(t, testenv.MySQLDatabase(t, ""), mysqlstore.Config{Clock: clock})
	})
}

// TestConformanceUncoalesced: every call its own round trip.
func TestConformanceUncoalesced(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestConformance runs the suite; this runs it uncoalesced")
	}
	storetest.RunClocked(t, caps, func(t testing.TB, clock idem.Clock) store.Store {
		return open(t, testenv.MySQLDatabase(t, ""), mysqlstore.Config{Clock: clock, NoCoalesce: true})
	})
}

// TestConformanceReadCommitted: the server's default isolation is
// REPEATABLE READ; the outcomes are the same under READ COMMITTED.
func TestConformanceReadCommitted(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestConformance runs the suite; this runs it under READ COMMITTED")
	}
	variable := "transaction_isolation" // MySQL 8 and MariaDB 11.1; tx_isolation before
	if s := newStore(t).(*mysqlstore.Store); s.MariaDB() {
		variable = "tx_isolation"
	}
	storetest.RunClocked(t, caps, func(t testing.TB, clock idem.Clock) store.Store {
		s := open(t, withParam(t, testenv.MySQLDatabase(t, ""), variable, "'READ-COMMITTED'"), mysqlstore.Config{Clock: clock})
		var level string
		if err := s.DB().QueryRow(`SELECT @@` + variable).Scan(&level); err != nil || level != "READ-COMMITTED" {
			t.Fatalf("the session's isolation is %q (%v)", level, err)
		}
		return s
	})
}

func withParam(t testing.TB, location, name, value string) string {
	u, err := url.Parse(location)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestMultiProcess(t *testing.T) {
	storetest.MultiProcess(t, "TestMultiProcess", location(t), 4, 200, openAt)
}

func TestCrashTakeover(t *testing.T) {
	storetest.CrashTakeover(t, "TestCrashTakeover", location(t), openAt)
}

// location is a database of the test's own; a storetest child is handed
// its parent's.
func location(t *testing.T) string {
	if storetest.IsChild() {
		return ""
	}
	return testenv.MySQLDatabase(t, "")
}

func BenchmarkStore(b *testing.B) { storetest.Bench(b, newStore) }

func TestCampaign(t *testing.T) { storetest.Campaign(t, campaignConfig(t, "TestCampaign")) }

// TestGuardCampaign runs guarded work (idem.Guard) under the same faults.
func TestGuardCampaign(t *testing.T) {
	storetest.GuardCampaign(t, campaignConfig(t, "TestGuardCampaign"))
}

// campaignConfig: a MariaDB server of the test's own, which every process
// reaches through a TCP proxy that the campaign cuts and stalls now and
// then (the Guard campaign's direct workers without it), and which the
// campaign crashes now and then.
func campaignConfig(t *testing.T, name string) storetest.CampaignConfig {
	cfg := storetest.CampaignConfig{TestName: name, Processes: 2,
		Open: func(t testing.TB, location string) store.Store {
			var s store.Store
			testenv.Eventually(t, 10*time.Second, "open the store", func() (err error) {
				st, err := mysqlstore.Open(context.Background(), mysqlstore.Config{DSN: location})
				if err != nil {
					return err
				}
				s = st
				return nil
			})
			t.Cleanup(func() { _ = s.Close() })
			return s
		}}
	if !storetest.IsChild() {
		srv := testenv.StartMariaDB(t)
		direct := srv.URL
		u, err := url.Parse(direct)
		if err != nil {
			t.Fatal(err)
		}
		p := testenv.StartProxy(t, u.Host)
		cfg.Cut, cfg.Restore, cfg.Stall, cfg.Unstall = p.Cut, p.Restore, p.Stall, p.Unstall
		cfg.Crash = func() { srv.Crash(t) }
		u.Host = p.Addr()
		cfg.Location, cfg.Direct = u.String(), direct
	}
	return cfg
}

func TestOutageFailsClosedAndRecovers(t *testing.T) {
	s, p := throughProxy(t)
	storetest.Outage(t, s, p.Cut, p.Restore)
}

func TestSettleAcrossABlip(t *testing.T) {
	s, p := throughProxy(t)
	storetest.SettleAcrossABlip(t, s, p.Cut, p.Restore)
}

func throughProxy(t *testing.T) (*mysqlstore.Store, *testenv.Proxy) {
	direct := testenv.MySQLDatabase(t, "")
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProxy(t, u.Host)
	u.Host = p.Addr()
	return open(t, withParam(t, u.String(), "timeout", "2s"), mysqlstore.Config{}), p
}

// TestCoalescedRoundTripsCarryManyCalls: goroutines running lifecycles
// share round trips, and every lifecycle ends as it would alone.
func TestCoalescedRoundTripsCarryManyCalls(t *testing.T) {
	s := newStore(t).(*mysqlstore.Store)
	testenv.CompleteMany(t, s, 64*40, func(i int) string { return fmt.Sprintf("many-%d", i) })
	trips, calls := s.CoalesceStats()
	t.Logf("%d shared round trips carried %d calls", trips, calls)
	if trips == 0 || calls < 2*trips {
		t.Fatalf("goroutines at once shared %d round trips carrying %d calls", trips, calls)
	}
}

// TestURLs: a URL names the server and the database; without a database,
// with another scheme or unparseable, it is refused with its password
// redacted.
func TestURLs(t *testing.T) {
	cfg, err := mysqlstore.ParseURL("mysql://app:s3cr%40t@db.example:3307/orders?tls=skip-verify&timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "app" || cfg.Passwd != "s3cr@t" || cfg.Addr != "db.example:3307" || cfg.DBName != "orders" || cfg.TLSConfig != "skip-verify" || cfg.Timeout != 5*time.Second {
		t.Fatalf("parsed %+v", cfg)
	}
	if cfg, err := mysqlstore.ParseURL("mysql://app@db.example/orders"); err != nil || cfg.Addr != "db.example:3306" {
		t.Fatalf("the default port: %v %v", cfg, err)
	}
	for _, bad := range []string{"mysql://app:hunter2@db.example:3306", "mysql://app:hunter2@db.example:3306/", "postgres://app:hunter2@db/x", "mysql://app:hunter2@db:3306/x?tls=nonsense"} {
		_, err := mysqlstore.ParseURL(bad)
		if err == nil {
			t.Fatalf("%s was accepted", bad)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("%s: the error shows the password: %v", bad, err)
		}
	}
	_, err = mysqlstore.Open(context.Background(), mysqlstore.Config{DSN: "mysql://app:hunter2@db.example:3306"})
	if err == nil || !strings.Contains(err.Error(), "names no database") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Open of a URL without a database: %v", err)
	}
}

// TestTableOfOtherTypesIsRefused: a table created by hand with other
// column types is refused at Open, naming the column.
func TestTableOfOtherTypesIsRefused(t *testing.T) {
	loc := testenv.MySQLDatabase(t, "")
	s := open(t, loc, mysqlstore.Config{})
	if _, err := s.DB().Exec(`ALTER TABLE idem_records MODIFY fence int NOT NULL`); err != nil {
		t.Fatal(err)
	}
	_, err := mysqlstore.Open(context.Background(), mysqlstore.Config{DSN: loc})
	if err == nil || !strings.Contains(err.Error(), "idem_records.fence is int, not bigint") {
		t.Fatalf("Open on a hand-altered table: %v", err)
	}
}

// TestErrorsKeepTheirCause: a missing table is not "unavailable", the
// driver's error stays reachable, and a closed store says ErrClosed.
func TestErrorsKeepTheirCause(t *testing.T) {
	s := open(t, testenv.MySQLDatabase(t, ""), mysqlstore.Config{NoCoalesce: true})
	if _, err := s.DB().Exec(`DROP TABLE idem_records`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	var me *mysql.MySQLError
	if err == nil || errors.Is(err, store.ErrUnavailable) || !errors.As(err, &me) || me.Number != 1146 {
		t.Fatalf("acquire on a missing table: %v", err)
	}
	// The connection of the failed transaction went back usable.
	if _, err := s.Get(ctx, "k"); err == nil || !errors.As(err, &me) || me.Number != 1146 {
		t.Fatalf("get on a missing table: %v", err)
	}
	s.Close()
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
}

func TestMemoryPerRecord(t *testing.T) {
	s := newStore(t).(*mysqlstore.Store)
	storetest.MemoryPerRecord(t, s, "InnoDB data and index bytes", func() (int64, error) { return s.TableBytes(context.Background()) })
}

// TestEightOpenAtOnce: eight stores opening a fresh database together
// migrate it once (the named lock idem_migrate), and each works.
func TestEightOpenAtOnce(t *testing.T) {
	loc := testenv.MySQLDatabase(t, "")
	stores := make(chan *mysqlstore.Store, 8)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			s, err := mysqlstore.Open(context.Background(), mysqlstore.Config{DSN: loc})
			if err != nil {
				errs <- err
				return
			}
			stores <- s
		}()
	}
	for range 8 {
		select {
		case err := <-errs:
			t.Fatal(err)
		case s := <-stores:
			t.Cleanup(func() { s.Close() })
			if _, err := s.Acquire(context.Background(), store.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := s.DB().QueryRow(`SELECT count(*) FROM idem_migrations WHERE component = 'records'`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("idem_migrations holds %d rows of records (%v), want 1", n, err)
			}
		}
	}
}

// TestServerCrash: a SIGKILL of a MariaDB server of the test's own, after
// each kind of write, loses no write the store acknowledged
// (innodb_flush_log_at_trx_commit=1, the default).
func TestServerCrash(t *testing.T) {
	srv := testenv.StartMariaDB(t)
	s := open(t, srv.URL, mysqlstore.Config{})
	storetest.ServerCrash(t, s, func() { srv.Crash(t) }, "MariaDB")
}
