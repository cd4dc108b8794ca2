package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/outboxtest"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

func pgPool(t testing.TB) (*pgxpool.Pool, string) {
	testenv.ProbePostgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	schema := testenv.RandomName("idemtest_")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
		pool.Close()
	})
	return pool, schema
}

// backend migrates an outbox of driver and returns it for the suite.
func backend[TTx any](t testing.TB, driver sqldriver.Driver[TTx], schema string) outboxtest.Backend[TTx] {
	t.Helper()
	open := func() *outbox.Outbox[TTx] {
		ob, err := outbox.New(driver, outbox.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ob.Close() })
		return ob
	}
	ob := open()
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return outboxtest.Backend[TTx]{Outbox: ob, Driver: driver, Reopen: open, Config: outbox.Config{Schema: schema}}
}

func TestPgx(t *testing.T) {
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend[pgx.Tx] {
		pool, schema := pgPool(t)
		return backend(t, pgxv5.New(pool), schema)
	})
}

// TestPgxAsync runs the suite on a server of the test's own whose sessions
// commit asynchronously (synchronous_commit off): Migrate finds it, and
// Enqueue's statement carries the condition that makes it commit durably
// (TestEnqueueSurvivesAServerCrash) — the same outcomes.
func TestPgxAsync(t *testing.T) {
	srv := testenv.StartPostgres(t, "synchronous_commit=off")
	pool, err := pgxpool.New(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend[pgx.Tx] {
		return backend(t, pgxv5.New(pool), testenv.RandomName("idemtest_"))
	})
}

// TestThroughPgBouncer runs the suite through a real PgBouncer in
// transaction pooling mode: exec mode (no prepared statements) and no
// LISTEN (the relay polls).
func TestThroughPgBouncer(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestPgx runs the suite; this runs it through PgBouncer")
	}
	bouncer := testenv.StartPgBouncer(t)
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend[pgx.Tx] {
		_, schema := pgPool(t) // creates and drops the schema, directly
		return backend(t, pgxv5.New(testenv.PgBouncerPool(t, bouncer), pgxv5.WithoutListen()), schema)
	})
}

func TestDatabaseSQLPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestPgx and TestSQLite run the suite; this runs it on database/sql over PostgreSQL")
	}
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend[*sql.Tx] {
		_, schema := pgPool(t)
		db, err := sql.Open("pgx", testenv.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return backend(t, databasesql.New(db, sqldriver.Postgres), schema)
	})
}

func TestSQLite(t *testing.T) {
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend[*sql.Tx] {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "outbox.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return backend(t, databasesql.New(db, sqldriver.SQLite), "")
	})
}

// TestMySQL runs the suite on MariaDB (or the server of IDEM_MYSQL_URL)
// through database/sql, each run in a database of its own;
// TestMySQLReadCommitted under READ COMMITTED (the server's default is
// REPEATABLE READ), on connections that count the rows an UPDATE matched
// rather than changed (clientFoundRows: how many rows a write reports
// depends on it).
func TestMySQL(t *testing.T) {
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend[*sql.Tx] {
		return backend(t, databasesql.New(testenv.OpenMySQL(t, testenv.MySQLDatabase(t, "")), sqldriver.MySQL), "")
	})
}

func TestMySQLReadCommitted(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestMySQL runs the suite; this runs it under READ COMMITTED")
	}
	outboxtest.Run(t, func(t testing.TB) outboxtest.Backend[*sql.Tx] {
		loc := testenv.MySQLReadCommitted(t, testenv.MySQLDatabase(t, ""))
		return backend(t, databasesql.New(testenv.OpenMySQL(t, loc+"&clientFoundRows=true"), sqldriver.MySQL), "")
	})
}

// TestListenNotifyWakesTheRelay: with a 30s poll interval, a committed row
// is sent within a second because the insert trigger's NOTIFY wakes the
// relay.
func TestListenNotifyWakesTheRelay(t *testing.T) {
	pool, schema := pgPool(t)
	s := backend(t, pgxv5.New(pool), schema).Outbox.Store
	ctx := context.Background()
	sent := make(chan time.Time, 4)
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: s, PollInterval: 30 * time.Second,
		Sender: outbox.SenderFunc(func(ctx context.Context, m *outbox.Message) outbox.Result {
			sent <- time.Now()
			return outbox.Result{Status: outbox.Sent}
		})})
	if err != nil {
		t.Fatal(err)
	}
	idle := outbox.ArmIdleSignal(r)
	if err := r.Start(ctx, func(err error) { t.Error(err) }); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	idle.WaitOrTimeout(t) // the relay is idle, listening
	for i := range 2 {
		start := time.Now()
		if err := s.Enqueue(ctx, outbox.Message{Key: fmt.Sprint("wake-", i), Destination: "test://x"}); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-sent:
			t.Logf("sent %v after the commit", at.Sub(start).Round(time.Millisecond))
		case <-time.After(5 * time.Second):
			t.Fatal("the relay did not wake up on NOTIFY")
		}
	}
}

// ownServer starts a PostgreSQL server of the test's own with settings
// and migrates an outbox on it, in schema idem.
func ownServer(t *testing.T, settings ...string) (*testenv.Postgres, *pgxpool.Pool, *outbox.Store) {
	srv := testenv.StartPostgres(t, settings...)
	pool, err := pgxpool.New(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return srv, pool, backend(t, pgxv5.New(pool), "idem").Outbox.Store
}

// TestRelayAfterAServerCrash: a relay woken by LISTEN/NOTIFY, with a 30 s
// poll interval, whose PostgreSQL server is killed (SIGKILL) and started
// again once the relay has met the outage, sends what is enqueued after
// the restart within seconds: it does not wait out its poll interval after
// the errors.
func TestRelayAfterAServerCrash(t *testing.T) {
	srv, _, s := ownServer(t)
	ctx := context.Background()
	sent := make(chan string, 16)
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: s, PollInterval: 30 * time.Second,
		Sender: outbox.SenderFunc(func(ctx context.Context, m *outbox.Message) outbox.Result {
			sent <- m.Key
			return outbox.Result{Status: outbox.Sent}
		})})
	if err != nil {
		t.Fatal(err)
	}
	idle := outbox.ArmIdleSignal(r)
	failed := make(chan struct{}, 1)
	if err := r.Start(ctx, func(err error) {
		t.Logf("relay: %v", err)
		select {
		case failed <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	idle.WaitOrTimeout(t)
	sentWithin := func(key string, d time.Duration) {
		t.Helper()
		start := time.Now()
		for {
			err := s.Enqueue(ctx, outbox.Message{Key: key, Destination: "test://x"})
			if err == nil {
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("enqueue %s: %v", key, err)
			}
		}
		select {
		case k := <-sent:
			if k != key {
				t.Fatalf("sent %s, want %s", k, key)
			}
			t.Logf("%s sent %v after its enqueue began", key, time.Since(start).Round(time.Millisecond))
		case <-time.After(d):
			t.Fatalf("%s not sent within %v of its enqueue", key, d)
		}
	}
	sentWithin("before", 5*time.Second)
	idle.WaitOrTimeout(t) // its outcome recorded, the relay waits
	srv.Kill()
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay heard nothing of the outage")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		sentWithin(fmt.Sprint("after-", i), 5*time.Second)
	}
}

// TestEnqueueSurvivesAServerCrash: a message Enqueue (alone, not in a
// transaction of the caller's) acknowledged survives a SIGKILL of the
// PostgreSQL server right after, even where the server's default
// synchronous_commit is off (PostgreSQL then acknowledges a commit before
// its WAL is written, and a crash loses the last fraction of a second of
// them). EnqueueTx keeps the caller's setting: the message shares its
// business change's fate.
func TestEnqueueSurvivesAServerCrash(t *testing.T) {
	srv, pool, s := ownServer(t, "synchronous_commit=off")
	enqueueAndCrash(t, srv, pool, s)
}

// TestEnqueueSurvivesAServerCrashAfterTheSettingChanged: the same where
// the server's synchronous_commit is turned off while the program runs,
// after Migrate saw it on.
func TestEnqueueSurvivesAServerCrashAfterTheSettingChanged(t *testing.T) {
	srv, pool, s := ownServer(t) // the default: on
	srv.Reconfigure(t, "synchronous_commit", "off")
	enqueueAndCrash(t, srv, pool, s)
}

// TestEnqueueSurvivesAFailover: an enqueue acknowledged is on the
// synchronous standby (named in synchronous_standby_names) when the
// primary dies and the standby is promoted, even where the sessions'
// synchronous_commit is local, under which PostgreSQL acknowledges a commit
// before the standby has it: a lost enqueue is a message never sent
// (testenv.FailOver parts the standby while eight goroutines enqueue).
func TestEnqueueSurvivesAFailover(t *testing.T) {
	primary, _, s := ownServer(t, "synchronous_commit=local", "synchronous_standby_names=s1")
	standby, link := primary.StartStandby(t, "s1")
	acked, parted := testenv.FailOver(t, primary, standby, link, func(ctx context.Context, key string) bool {
		return s.Enqueue(ctx, outbox.Message{Key: key, Destination: "test://x", Payload: []byte("p")}) == nil
	})
	ctx := context.Background()
	after, err := pgx.Connect(ctx, standby.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close(ctx)
	var rows int
	if err := after.QueryRow(ctx, `SELECT count(*) FROM idem.idem_outbox WHERE key = ANY($1)`, acked).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d enqueues acknowledged (%d while the standby was parted), %d there after the failover", len(acked), parted, rows)
	if rows != len(acked) {
		t.Fatalf("after the failover %d of %d acknowledged enqueues remain", rows, len(acked))
	}
}

// enqueueAndCrash enqueues 600 messages alone, crashes srv and wants them
// all there after the restart.
func enqueueAndCrash(t *testing.T, srv *testenv.Postgres, pool *pgxpool.Pool, s *outbox.Store) {
	t.Helper()
	ctx := context.Background()
	const n = 600
	for i := range n {
		if err := s.Enqueue(ctx, outbox.Message{Key: fmt.Sprint("m", i), Destination: "test://x", Payload: []byte("p")}); err != nil {
			t.Fatal(err)
		}
	}
	srv.Crash(t)
	var rows int
	testenv.Eventually(t, 30*time.Second, "the server answers after the restart", func() error {
		return pool.QueryRow(ctx, `SELECT count(*) FROM idem.idem_outbox`).Scan(&rows)
	})
	if rows != n {
		t.Fatalf("after the crash %d of %d acknowledged enqueues remain", rows, n)
	}
}

// TestRecordingAcrossABlip: the database is out of reach for a moment just
// as a send succeeds. The relay records the outcome again, with backoff,
// while its claim lasts: the row ends sent, and the message is not sent a
// second time once the claim would have run out.
func TestRecordingAcrossABlip(t *testing.T) {
	conn, proxy := testenv.PostgresProxy(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	direct, schema := pgPool(t) // creates the schema; reads the rows without the proxy
	s := backend(t, pgxv5.New(pool), schema).Outbox.Store
	if err := s.Enqueue(ctx, outbox.Message{Key: "blip", Destination: "test://x"}); err != nil {
		t.Fatal(err)
	}
	var sends int
	const lease = 2 * time.Second
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: s, Lease: lease, SendTimeout: lease / 2,
		Sender: outbox.SenderFunc(func(ctx context.Context, m *outbox.Message) outbox.Result {
			sends++
			if sends == 1 {
				proxy.Cut()
				time.AfterFunc(lease/8, proxy.Restore) // a blip: a time, not an event
			}
			return outbox.Result{Status: outbox.Sent}
		})})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); n != 1 || err != nil {
		t.Fatalf("the run whose recording met the blip: %d rows, %v; want 1 and no error", n, err)
	}
	var status string
	if err := direct.QueryRow(ctx, `SELECT status FROM `+schema+`.idem_outbox WHERE key = 'blip'`).Scan(&status); err != nil || status != string(outbox.Sent) {
		t.Fatalf("the row: %q, %v; want sent", status, err)
	}
	time.Sleep(lease) // past the claim: a row still claimed would be due again
	if n, err := r.RunOnce(ctx); n != 0 || err != nil || sends != 1 {
		t.Fatalf("after the claim: %d rows, %v, %d sends; want none and one", n, err, sends)
	}
}

// TestCampaign runs the outbox's fault campaign on a PostgreSQL server of
// the test's own (pgx, LISTEN and all) through a proxy that cuts and stalls
// the connections of the test's processes and of half its relay processes
// (the others reach PostgreSQL directly: a partition); now and then the
// server is killed with SIGKILL and started again.
func TestCampaign(t *testing.T) {
	outboxtest.Campaign(t, campaignOnPostgres(t, "TestCampaign", false))
}

// TestCampaignThroughPgBouncer runs it through a real PgBouncer in
// transaction pooling mode (no LISTEN: the relays poll), the proxy in front
// of PgBouncer, on a server of the test's own whose default
// synchronous_commit is off (Enqueue's statement raises it), killed now
// and then too.
func TestCampaignThroughPgBouncer(t *testing.T) {
	outboxtest.Campaign(t, campaignOnPostgres(t, "TestCampaignThroughPgBouncer", true))
}

func campaignOnPostgres(t *testing.T, name string, bouncer bool) outboxtest.CampaignConfig[pgx.Tx] {
	cfg := outboxtest.CampaignConfig[pgx.Tx]{TestName: name, Open: openCampaignPostgres}
	if loc := os.Getenv("IDEM_OUTBOX_CAMPAIGN_LOCATION"); loc != "" { // a relay process
		cfg.Location = loc
		return cfg
	}
	var settings []string
	if bouncer {
		settings = append(settings, "synchronous_commit=off")
	}
	srv := testenv.StartPostgres(t, settings...)
	direct, schema, mode := srv.URL, "idem", ""
	cfg.Crash = func() { srv.Crash(t) }
	if bouncer {
		direct, mode = srv.PgBouncer(t), "pgbouncer"
	}
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, u.Host)
	proxied := strings.Replace(direct, u.Host, proxy.Addr(), 1)
	cfg.Location, cfg.Direct = proxied+"\n"+schema+"\n"+mode, direct+"\n"+schema+"\n"+mode
	cfg.Cut, cfg.Restore, cfg.Stall, cfg.Unstall = proxy.Cut, proxy.Restore, proxy.Stall, proxy.Unstall
	return cfg
}

// openCampaignPostgres opens the outbox at location: a connection string,
// a schema and "pgbouncer" or nothing, a line each.
func openCampaignPostgres(t testing.TB, location string) outboxtest.Backend[pgx.Tx] {
	lines := strings.SplitN(location, "\n", 3)
	var opts []pgxv5.Option
	var tune func(*pgxpool.Config)
	if lines[2] == "pgbouncer" {
		tune = func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec }
		opts = append(opts, pgxv5.WithoutListen())
	}
	driver := pgxv5.New(testenv.CampaignPool(t, lines[0], tune), opts...)
	// A process started while the campaign cuts the server, or while
	// PgBouncer refuses logins after a crash (server_login_retry), waits
	// until the schema can be read.
	testenv.Eventually(t, 10*time.Second, "the outbox's schema migrated", func() error {
		ob, err := outbox.New(driver, outbox.Config{Schema: lines[1]})
		if err != nil {
			t.Fatal(err)
		}
		defer ob.Close()
		return ob.Migrate(context.Background())
	})
	return backend(t, driver, lines[1])
}

// TestCampaignSQLite runs the outbox's fault campaign on one SQLite file
// shared by every process (no server to cut; a relay frozen holding the
// write lock stalls the others).
func TestCampaignSQLite(t *testing.T) {
	loc := os.Getenv("IDEM_OUTBOX_CAMPAIGN_LOCATION")
	if loc == "" {
		loc = filepath.Join(t.TempDir(), "outbox.db")
	}
	outboxtest.Campaign(t, outboxtest.CampaignConfig[*sql.Tx]{TestName: "TestCampaignSQLite", Location: loc,
		Open: func(t testing.TB, loc string) outboxtest.Backend[*sql.Tx] {
			db, err := sql.Open("sqlite", "file:"+loc+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return backend(t, databasesql.New(db, sqldriver.SQLite), "")
		}})
}

// TestCampaignMySQL runs the outbox's fault campaign on a MariaDB server of
// the test's own through database/sql (the relays poll), behind a proxy
// that cuts and stalls the connections of the test's processes and of half
// its relay processes; now and then the server is killed with SIGKILL and
// started again.
func TestCampaignMySQL(t *testing.T) {
	cfg := outboxtest.CampaignConfig[*sql.Tx]{TestName: "TestCampaignMySQL", Open: openCampaignMySQL}
	if loc := os.Getenv("IDEM_OUTBOX_CAMPAIGN_LOCATION"); loc != "" { // a relay process
		cfg.Location = loc
	} else {
		srv := testenv.StartMariaDB(t)
		proxy := testenv.StartProxy(t, srv.Addr())
		cfg.Location, cfg.Direct = strings.Replace(srv.URL, srv.Addr(), proxy.Addr(), 1), srv.URL
		cfg.Crash = func() { srv.Crash(t) }
		cfg.Cut, cfg.Restore, cfg.Stall, cfg.Unstall = proxy.Cut, proxy.Restore, proxy.Stall, proxy.Unstall
	}
	outboxtest.Campaign(t, cfg)
}

// openCampaignMySQL opens the outbox at the mysql:// URL location; a
// process started while the campaign cuts the server waits until the
// schema can be read.
func openCampaignMySQL(t testing.TB, location string) outboxtest.Backend[*sql.Tx] {
	driver := databasesql.New(testenv.OpenMySQL(t, location+"?timeout=2s"), sqldriver.MySQL)
	testenv.Eventually(t, 10*time.Second, "the outbox's schema migrated", func() error {
		ob, err := outbox.New(driver, outbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer ob.Close()
		return ob.Migrate(context.Background())
	})
	return backend(t, driver, "")
}

// TestClaimSurvivesAServerCrash: a relay's claim survives a SIGKILL of the
// PostgreSQL server right after it, even where the server's default
// synchronous_commit is off (and its WAL writer is stopped): a claim
// lost in the crash would let another relay claim the row while this one
// is still sending it — two sends of one message at once, and an ordering
// key's rows out of order.
func TestClaimSurvivesAServerCrash(t *testing.T) {
	srv, pool, s := ownServer(t, "synchronous_commit=off", "wal_writer_delay=10000ms")
	ctx := context.Background()
	if err := s.Enqueue(ctx, outbox.Message{Key: "claimed", Destination: "test://x"}); err != nil {
		t.Fatal(err)
	}
	// The WAL writer stopped: a commit acknowledged before its WAL is
	// written (asynchronously) stays in memory until the crash.
	var walwriter int
	if err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&walwriter); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(walwriter, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	sending, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: s, Lease: time.Minute, SendTimeout: 30 * time.Second,
		Sender: outbox.SenderFunc(func(ctx context.Context, m *outbox.Message) outbox.Result {
			once.Do(func() { close(sending) })
			<-release
			return outbox.Result{Status: outbox.Pending}
		})})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = r.RunOnce(ctx) }()
	<-sending // claimed, and being sent
	srv.Crash(t)
	defer close(release)
	var claimed bool
	testenv.Eventually(t, 30*time.Second, "the server answers after the restart", func() error {
		return pool.QueryRow(ctx, `SELECT claimed_by IS NOT NULL FROM idem.idem_outbox WHERE key = 'claimed'`).Scan(&claimed)
	})
	if !claimed {
		t.Fatal("the relay's claim was lost in the crash: another relay may send the row while this one sends it")
	}
}

// TestMySQLTableMadeByHand: an outbox created by hand on MySQL whose keys
// compare without regard to case is refused at Migrate, naming the column:
// a second message whose key differs in case only would be taken for the
// first's repeat.
func TestMySQLTableMadeByHand(t *testing.T) {
	ctx := context.Background()
	db := testenv.OpenMySQL(t, testenv.MySQLDatabase(t, ""))
	if _, err := db.ExecContext(ctx, "CREATE TABLE idem_outbox_counters (name varchar(255) NOT NULL PRIMARY KEY, value bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(databasesql.New(db, sqldriver.MySQL), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	if err := ob.Migrate(ctx); err == nil || !strings.Contains(err.Error(), "idem_outbox_counters.name") {
		t.Fatalf("Migrate: %v; want idem_outbox_counters.name refused", err)
	}
}
