package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/sqldriver/pgxv5"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/redisstore"
)

// The services' URLs, from the environment or the local defaults.
var (
	PostgresURL = URL("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	RedisURL    = URL("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
)

// childEnv marks a process started by storetest.MultiProcess or
// CrashTakeover; a child leaves the shared schema or prefix in place.
func isChild() bool { return URL("IDEM_STORETEST_MODE", "") != "" }

// probeTimeout bounds a probe of a service: 3s, or 30s in a storetest
// child — its parent found the service already, and a child started while
// a campaign loads the machine can be slow to connect (a worker process
// failed its 3s probe so, failing a campaign that had found no fault).
func probeTimeout() time.Duration {
	if isChild() {
		return 30 * time.Second
	}
	return 3 * time.Second
}

// RandomName returns prefix followed by 12 random hex digits.
func RandomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// ProbePostgres skips or fails t when PostgreSQL does not answer.
func ProbePostgres(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout())
	defer cancel()
	conn, err := pgx.Connect(ctx, PostgresURL)
	if err == nil {
		err = conn.Ping(ctx)
		conn.Close(ctx)
	}
	Need(t, "PostgreSQL", PostgresURL, err)
}

// OpenPostgres opens a pgstore in schema (created) at cfg.ConnString
// (PostgresURL when empty); unless this process is a storetest child, the
// schema is dropped at cleanup.
func OpenPostgres(t testing.TB, schema string, cfg pgstore.Config) *pgstore.Store {
	t.Helper()
	ProbePostgres(t)
	if cfg.ConnString == "" {
		cfg.ConnString = PostgresURL
	}
	cfg.Schema = schema
	s, err := pgstore.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !isChild() {
			_, _ = s.Pool().Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		}
		s.Close()
	})
	return s
}

// RedisClient returns a client for RedisURL, or skips or fails t.
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL)
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	opt.MaxRetries = -1 // as redisstore.Config.Client asks
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout())
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		Need(t, "Redis", RedisURL, err)
	}
	return c
}

// OpenRedis opens a redisstore under prefix; unless this process is a
// storetest child, the prefix's keys are deleted at cleanup.
func OpenRedis(t testing.TB, prefix string) *redisstore.Store { return OpenRedisAt(t, "", prefix) }

// OpenRedisAt is OpenRedis through addr (host:port; RedisURL's when empty),
// for example a Proxy's address.
func OpenRedisAt(t testing.TB, addr, prefix string) *redisstore.Store {
	t.Helper()
	return OpenRedisConfig(t, addr, redisstore.Config{Prefix: prefix})
}

// OpenRedisConfig is OpenRedisAt with a Config (its Client, CloseClient
// set here).
func OpenRedisConfig(t testing.TB, addr string, cfg redisstore.Config) *redisstore.Store {
	t.Helper()
	prefix := cfg.Prefix
	c := RedisClient(t)
	if addr != "" {
		opt := *c.Options()
		opt.Addr = addr
		opt.MaxRetries = -1 // NewClient turned the -1 into 0; 0 would mean 3 again
		// Through a proxy that delays (Proxy.SetDelay) every call holds its
		// connection longer: enough of them that a benchmark's goroutines
		// do not wait for the pool.
		opt.PoolSize = max(opt.PoolSize, 64)
		c.Close()
		c = redis.NewClient(&opt)
	}
	cfg.Client, cfg.CloseClient = c, true
	s, err := redisstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !isChild() {
			ctx := context.Background()
			it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for it.Next(ctx) {
				c.Del(ctx, it.Val())
			}
		}
		s.Close()
	})
	return s
}

// NATSURL and AMQPURL are the brokers' URLs.
var (
	NATSURL = URL("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222")
	AMQPURL = URL("IDEM_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
)

// PostgresProxy starts a Proxy in front of PostgreSQL and returns the
// connection string that goes through it.
func PostgresProxy(t testing.TB) (connString string, p *Proxy) {
	t.Helper()
	ProbePostgres(t)
	u, err := url.Parse(PostgresURL)
	if err != nil {
		t.Fatalf("IDEM_TEST_POSTGRES_URL: %v", err)
	}
	p = StartProxy(t, u.Host)
	u.Host = p.Addr()
	return u.String(), p
}

// RedisProxy starts a Proxy in front of Redis.
func RedisProxy(t testing.TB) *Proxy {
	t.Helper()
	c := RedisClient(t)
	defer c.Close()
	return StartProxy(t, c.Options().Addr)
}

// PostgresInbox is PostgresSchema with a migrated inbox in the schema (its
// processed_events and entity_versions tables) on the pool.
func PostgresInbox(t testing.TB, ddl func(schema string) string) (*pgxpool.Pool, string, *inbox.Inbox[pgx.Tx]) {
	t.Helper()
	pool, schema := PostgresSchema(t, ddl)
	ib, err := inbox.New(pgxv5.New(pool), inbox.Config{Table: schema + ".processed_events", VersionTable: schema + ".entity_versions"})
	if err == nil {
		err = ib.Migrate(context.Background())
	}
	if err != nil {
		t.Fatal(err)
	}
	return pool, schema, ib
}

// PostgresSchema connects a pool to the test PostgreSQL and creates a
// fresh schema in it, running ddl there (its tables named schema.NAME by
// the caller); the schema is dropped and the pool closed when the test
// ends.
func PostgresSchema(t testing.TB, ddl func(schema string) string) (*pgxpool.Pool, string) {
	t.Helper()
	ProbePostgres(t)
	return PostgresSchemaOn(t, PostgresURL, ddl)
}

// PostgresSchemaOn is PostgresSchema on the server at connString (a
// server of the test's own: StartPostgres).
func PostgresSchemaOn(t testing.TB, connString string, ddl func(schema string) string) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	schema := RandomName("idemtest_")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema+`; `+ddl(schema)); err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
		pool.Close()
	})
	return pool, schema
}

// CampaignPool opens a pgx pool on connString for a campaign's process:
// its connections give up on a server that does not answer within two
// seconds (one cut or killed by the campaign), so calls fail rather than
// hang. tune, if set, changes the configuration further. The pool is
// closed when t ends.
func CampaignPool(t testing.TB, connString string, tune func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	if tune != nil {
		tune(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// MySQLURL is the MySQL or MariaDB server of the tests (a mysql:// URL
// whose database the tests may create others beside).
var MySQLURL = URL("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")

// MySQLDatabase creates a database of its own for t on MySQLURL's server
// (dropped at cleanup unless this process is a storetest child, or, when
// name is given, reused) and returns the mysql:// URL that names it. It
// skips or fails t when the server does not answer.
func MySQLDatabase(t testing.TB, name string) string {
	t.Helper()
	u, err := url.Parse(MySQLURL)
	if err != nil {
		t.Fatalf("IDEM_MYSQL_URL: %v", err)
	}
	if name == "" {
		name = RandomName("idemtest_")
	}
	admin := MySQLDSN(u.String())
	db, err := sql.Open("mysql", admin)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout())
		err = db.PingContext(ctx)
		cancel()
	}
	if err != nil {
		if db != nil {
			db.Close()
		}
		Need(t, "MySQL", u.Redacted(), err)
	}
	if _, err := db.Exec("CREATE DATABASE IF NOT EXISTS `" + name + "` CHARACTER SET utf8mb4"); err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !isChild() {
			_, _ = db.Exec("DROP DATABASE IF EXISTS `" + name + "`")
		}
		db.Close()
	})
	u.Path = "/" + name
	return u.String()
}

// OpenMySQL opens database/sql on the mysql:// URL loc (MySQLDatabase's) as
// sqldriver.MySQL needs it (parseTime, UTC), closed when t ends.
func OpenMySQL(t testing.TB, loc string) *sql.DB {
	t.Helper()
	dsn := MySQLDSN(loc)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("mysql", dsn+sep+"parseTime=true&loc=UTC")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// MySQLReadCommitted returns the mysql:// URL loc with the parameter that
// makes its sessions READ COMMITTED (the server's default is REPEATABLE
// READ): transaction_isolation, or tx_isolation on a MariaDB before 11.1.
func MySQLReadCommitted(t testing.TB, loc string) string {
	t.Helper()
	var version string
	if err := OpenMySQL(t, loc).QueryRow(`SELECT VERSION()`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	variable := "transaction_isolation"
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err == nil && strings.Contains(version, "MariaDB") && (major < 11 || major == 11 && minor < 1) {
		variable = "tx_isolation"
	}
	u, err := url.Parse(loc)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(variable, "'READ-COMMITTED'")
	u.RawQuery = q.Encode()
	var level string
	if err := OpenMySQL(t, u.String()).QueryRow(`SELECT @@` + variable).Scan(&level); err != nil || level != "READ-COMMITTED" {
		t.Fatalf("the session's isolation is %q (%v)", level, err)
	}
	return u.String()
}

// MySQLDSN is the go-sql-driver DSN of a mysql:// URL.
func MySQLDSN(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	host := u.Host
	if u.Port() == "" {
		host += ":3306"
	}
	dsn := "tcp(" + host + ")" + u.Path
	if u.User != nil {
		pass, _ := u.User.Password()
		dsn = u.User.Username() + ":" + pass + "@" + dsn
	}
	if u.RawQuery != "" {
		dsn += "?" + u.RawQuery
	}
	return dsn
}
