package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// backend runs the inbox against one database through one driver.
type backend struct {
	// process runs ev; fn adds one row to the business table in the same
	// transaction.
	process func(ctx context.Context, ev inbox.Event, fail error) (inbox.Outcome, error)
	// processBatch runs evs in one batch; each item adds one row, then
	// returns fail[its id].
	processBatch func(ctx context.Context, evs []inbox.Event, fail map[string]error) ([]inbox.BatchResult, error)
	rows         func(ctx context.Context) int
	// rowsOf counts the business rows of one id.
	rowsOf       func(ctx context.Context, ref string) int
	applyVersion func(ctx context.Context, entity string, v int64) (bool, error)
	sweep        func(ctx context.Context, olderThan time.Duration, limit int) (int, error)
}

// newBackend migrates an inbox on driver whose business table is credits
// and insert adds one row to it in the caller's transaction.
func newBackend[TTx any](t *testing.T, driver sqldriver.Driver[TTx], prefix string, insert func(ctx context.Context, tx TTx, ref string) error) backend {
	ib, err := inbox.New(driver, inbox.Config{Table: prefix + "processed_events", VersionTable: prefix + "entity_versions"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return backend{
		process: func(ctx context.Context, ev inbox.Event, fail error) (inbox.Outcome, error) {
			return ib.Process(ctx, ev, func(ctx context.Context, tx TTx) error {
				if err := insert(ctx, tx, ev.CorrelationID); err != nil {
					return err
				}
				return fail
			})
		},
		processBatch: func(ctx context.Context, evs []inbox.Event, fail map[string]error) ([]inbox.BatchResult, error) {
			items := make([]inbox.BatchItem[TTx], len(evs))
			for n, ev := range evs {
				items[n] = inbox.BatchItem[TTx]{Event: ev, Fn: func(ctx context.Context, tx TTx) error {
					if err := insert(ctx, tx, ev.CorrelationID); err != nil {
						return err
					}
					return fail[ev.CorrelationID]
				}}
			}
			return ib.ProcessBatch(ctx, items)
		},
		rowsOf: func(ctx context.Context, ref string) (n int) {
			_ = driver.Executor().QueryRow(ctx, `SELECT count(*) FROM `+prefix+`credits WHERE ref = $1`, ref).Scan(&n)
			return n
		},
		rows: func(ctx context.Context) (n int) {
			_ = driver.Executor().QueryRow(ctx, `SELECT count(*) FROM `+prefix+`credits`).Scan(&n)
			return n
		},
		applyVersion: ib.ApplyVersion,
		sweep:        ib.Sweep,
	}
}

func pgSchema(t *testing.T) (*pgxpool.Pool, string) {
	testenv.ProbePostgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	schema := testenv.RandomName("idemtest_")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.credits (id bigserial PRIMARY KEY, ref text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
		pool.Close()
	})
	return pool, schema
}

// creditPgx adds one row to the business table credits of prefix
// ("schema." or "").
func creditPgx(prefix string) func(ctx context.Context, tx pgx.Tx, ref string) error {
	return func(ctx context.Context, tx pgx.Tx, ref string) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+prefix+`credits (ref) VALUES ($1)`, ref)
		return err
	}
}

func newPgx(t *testing.T) backend {
	pool, schema := pgSchema(t)
	return newBackend(t, pgxv5.New(pool), schema+".", creditPgx(schema+"."))
}

// newPgxBouncer: the inbox through a real PgBouncer in transaction pooling
// mode (exec mode: no prepared statements).
func newPgxBouncer(t *testing.T) backend {
	pool, schema := pgSchema(t)
	_ = pool // the schema and its business table, made directly
	bounced := testenv.PgBouncerPool(t, testenv.StartPgBouncer(t))
	return newBackend(t, pgxv5.New(bounced, pgxv5.WithoutListen()), schema+".", creditPgx(schema+"."))
}

func sqlBackend(t *testing.T, db *sql.DB, d sqldriver.Dialect, prefix string) backend {
	insert := `INSERT INTO ` + prefix + `credits (ref) VALUES ($1)`
	if d == sqldriver.MySQL {
		insert = `INSERT INTO ` + prefix + `credits (ref) VALUES (?)`
	}
	return newBackend(t, databasesql.New(db, d), prefix, func(ctx context.Context, tx *sql.Tx, ref string) error {
		_, err := tx.ExecContext(ctx, insert, ref)
		return err
	})
}

func newSQLPostgres(t *testing.T) backend {
	_, schema := pgSchema(t)
	return sqlBackend(t, sqlPostgres(t, testenv.PostgresURL), sqldriver.Postgres, schema+".")
}

// sqlPostgres opens database/sql on pgx's driver at url, closed when the
// test ends.
func sqlPostgres(t *testing.T, url string) *sql.DB {
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func newSQLite(t *testing.T) backend {
	path := filepath.Join(t.TempDir(), "inbox.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE credits (id INTEGER PRIMARY KEY, ref TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return sqlBackend(t, db, sqldriver.SQLite, "")
}

// newPgxAsync and newSQLPostgresAsync: the inbox on a server of the test's
// own whose sessions commit asynchronously (synchronous_commit off):
// Migrate finds it, and every claim carries the condition that makes its
// transaction commit durably (TestServerCrash) — the same outcomes.
func newPgxAsync(t *testing.T) backend {
	_, pool := asyncServer(t)
	return newBackend(t, pgxv5.New(pool), "", creditPgx(""))
}

func newSQLPostgresAsync(t *testing.T) backend {
	srv, _ := asyncServer(t)
	return sqlBackend(t, sqlPostgres(t, srv.URL), sqldriver.Postgres, "")
}

// newMySQL: the inbox on MariaDB (or the server of IDEM_MYSQL_URL) through
// database/sql, in a database of the test's own.
func newMySQL(t *testing.T) backend { return mysqlBackend(t, testenv.MySQLDatabase(t, "")) }

// newMySQLReadCommitted: the same under READ COMMITTED.
func newMySQLReadCommitted(t *testing.T) backend {
	return mysqlBackend(t, testenv.MySQLReadCommitted(t, testenv.MySQLDatabase(t, "")))
}

func mysqlBackend(t *testing.T, loc string) backend {
	db := testenv.OpenMySQL(t, loc)
	if _, err := db.Exec(`CREATE TABLE credits (id bigint AUTO_INCREMENT PRIMARY KEY, ref varchar(255) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return sqlBackend(t, db, sqldriver.MySQL, "")
}

var backends = map[string]func(t *testing.T) backend{
	"mysql":                 newMySQL,
	"mysql-read-committed":  newMySQLReadCommitted,
	"pgx":                   newPgx,
	"pgx-async":             newPgxAsync,
	"pgx-pgbouncer":         newPgxBouncer,
	"database-sql-pg":       newSQLPostgres,
	"database-sql-pg-async": newSQLPostgresAsync,
	"sqlite":                newSQLite,
}

func TestInbox(t *testing.T) {
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			ctx := context.Background()
			t.Run("ConcurrentDuplicatesCommitOnce", func(t *testing.T) {
				ev := inbox.Event{Consumer: "credits", CorrelationID: "PAY-1", Type: "credit"}
				var wg sync.WaitGroup
				counts := make(chan inbox.Outcome, 20)
				for range 20 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						out, err := b.process(ctx, ev, nil)
						if err != nil {
							t.Error(err)
						}
						counts <- out
					}()
				}
				wg.Wait()
				close(counts)
				var processed, dup int
				for o := range counts {
					switch o {
					case inbox.Processed:
						processed++
					case inbox.Duplicate:
						dup++
					}
				}
				if processed != 1 || dup != 19 || b.rows(ctx) != 1 {
					t.Fatalf("processed %d, duplicate %d, rows %d; want 1, 19, 1", processed, dup, b.rows(ctx))
				}
			})
			t.Run("FailureRollsBackTheKey", func(t *testing.T) {
				ev := inbox.Event{Consumer: "credits", CorrelationID: "PAY-2"}
				before := b.rows(ctx)
				boom := errors.New("ledger down")
				if _, err := b.process(ctx, ev, boom); !errors.Is(err, boom) {
					t.Fatalf("err = %v", err)
				}
				if b.rows(ctx) != before {
					t.Fatal("the failed business change committed")
				}
				if out, err := b.process(ctx, ev, nil); err != nil || out != inbox.Processed {
					t.Fatalf("redelivery after a failure: %v %v (must run again)", out, err)
				}
			})
			t.Run("ConsumersAreSeparate", func(t *testing.T) {
				for _, c := range []string{"a", "b"} {
					if out, err := b.process(ctx, inbox.Event{Consumer: c, CorrelationID: "PAY-3"}, nil); err != nil || out != inbox.Processed {
						t.Fatalf("consumer %s: %v %v", c, out, err)
					}
				}
			})
			t.Run("VersionGuard", func(t *testing.T) {
				before := b.rows(ctx)
				var got []inbox.Outcome
				for i, v := range []int64{1, 3, 2, 3, 4} {
					out, err := b.process(ctx, inbox.Event{Consumer: "prices", CorrelationID: fmt.Sprint("upd-", i), Entity: "sku-9", Version: v}, nil)
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, out)
				}
				want := []inbox.Outcome{inbox.Processed, inbox.Processed, inbox.Stale, inbox.Stale, inbox.Processed}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("outcomes %v, want %v", got, want)
				}
				if b.rows(ctx)-before != 3 {
					t.Fatalf("stale updates changed data: %d rows added, want 3", b.rows(ctx)-before)
				}
				// A stale update is marked handled: its redelivery is a duplicate.
				if out, _ := b.process(ctx, inbox.Event{Consumer: "prices", CorrelationID: "upd-2", Entity: "sku-9", Version: 2}, nil); out != inbox.Duplicate {
					t.Fatalf("redelivered stale update: %v", out)
				}
				// Standalone, outside a transaction.
				if ok, err := b.applyVersion(ctx, "sku-9", 4); err != nil || ok {
					t.Fatalf("standalone stale: %v %v", ok, err)
				}
				if ok, err := b.applyVersion(ctx, "sku-9", 5); err != nil || !ok {
					t.Fatalf("standalone fresh: %v %v", ok, err)
				}
			})
			t.Run("Sweep", func(t *testing.T) {
				time.Sleep(20 * time.Millisecond)
				total := 0
				for {
					n, err := b.sweep(ctx, 10*time.Millisecond, 3)
					if err != nil {
						t.Fatal(err)
					}
					if n == 0 {
						break
					}
					total += n
				}
				if total < 8 {
					t.Fatalf("swept %d keys", total)
				}
				if out, _ := b.process(ctx, inbox.Event{Consumer: "credits", CorrelationID: "PAY-1"}, nil); out != inbox.Processed {
					t.Fatalf("a swept key is new again: %v", out)
				}
			})
		})
	}
}

func TestProcessBatch(t *testing.T) {
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			ctx := context.Background()
			ev := func(id string) inbox.Event { return inbox.Event{Consumer: "credits", CorrelationID: id} }
			t.Run("OneCommitManyOutcomes", func(t *testing.T) {
				for _, id := range []string{"old-1", "old-2"} {
					if out, err := b.process(ctx, ev(id), nil); err != nil || out != inbox.Processed {
						t.Fatal(out, err)
					}
				}
				boom := errors.New("ledger refused")
				evs := []inbox.Event{
					ev("new-1"), ev("old-1"), ev("fails"), ev("new-2"), ev("new-1"), // new-1 twice: the copy is a duplicate
					ev("fails"),           // its first copy failed: redeliver this one too
					{Consumer: "credits"}, // invalid: no id
					ev("old-2"), ev("new-3"),
				}
				res, err := b.processBatch(ctx, evs, map[string]error{"fails": boom})
				if err != nil {
					t.Fatal(err)
				}
				want := []string{"processed", "duplicate", "error", "processed", "duplicate", "earlier", "error", "duplicate", "processed"}
				for n, r := range res {
					got := r.Outcome.String()
					switch {
					case errors.Is(r.Err, inbox.ErrEarlierCopyFailed):
						got = "earlier"
					case r.Err != nil:
						got = "error"
					}
					if got != want[n] {
						t.Errorf("item %d (%q): %s (%v), want %s", n, evs[n].CorrelationID, got, r.Err, want[n])
					}
				}
				if !errors.Is(res[2].Err, boom) {
					t.Errorf("the failing item's error is %v, want its own", res[2].Err)
				}
				for id, rows := range map[string]int{"new-1": 1, "new-2": 1, "new-3": 1, "old-1": 1, "fails": 0} {
					if got := b.rowsOf(ctx, id); got != rows {
						t.Errorf("%s: %d business rows, want %d", id, got, rows)
					}
				}
				// The failed item was unclaimed: its redelivery runs.
				if out, err := b.process(ctx, ev("fails"), nil); err != nil || out != inbox.Processed {
					t.Fatalf("redelivery of the failed item: %v %v, want processed", out, err)
				}
			})
			t.Run("ConcurrentBatchesCommitEachKeyOnce", func(t *testing.T) {
				// 8 consumers take overlapping batches of the same 200 keys.
				var wg sync.WaitGroup
				var mu sync.Mutex
				processed := map[string]int{}
				for w := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for start := 0; start < 200; start += 20 {
							var evs []inbox.Event
							for k := range 25 {
								evs = append(evs, ev(fmt.Sprint("c-", (start+k+w*7)%200)))
							}
							res, err := b.processBatch(ctx, evs, nil)
							if err != nil {
								t.Error(err) // batches claim in key order: no deadlock
								continue
							}
							mu.Lock()
							for n, r := range res {
								if r.Err != nil {
									t.Error(r.Err)
								}
								if r.Outcome == inbox.Processed {
									processed[evs[n].CorrelationID]++
								}
							}
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				for k := range 200 {
					id := fmt.Sprint("c-", k)
					if processed[id] > 1 || b.rowsOf(ctx, id) != processed[id] {
						t.Fatalf("%s: processed %d times, %d business rows", id, processed[id], b.rowsOf(ctx, id))
					}
				}
			})
			t.Run("VersionGuardPerItem", func(t *testing.T) {
				vev := func(id string, v int64) inbox.Event {
					return inbox.Event{Consumer: "prices", CorrelationID: id, Entity: "sku-1", Version: v}
				}
				res, err := b.processBatch(ctx, []inbox.Event{vev("v2", 2), vev("v1", 1), vev("v3", 3)}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := fmt.Sprint(res[0].Outcome, res[1].Outcome, res[2].Outcome); got != "processed stale processed" {
					t.Fatalf("outcomes %s", got)
				}
				if b.rowsOf(ctx, "v1") != 0 {
					t.Fatal("a stale item changed data")
				}
			})
		})
	}
}

func TestBadEvents(t *testing.T) {
	if _, err := inbox.New(databasesql.New(nil, sqldriver.SQLite), inbox.Config{Table: "x; DROP TABLE y"}); err == nil {
		t.Fatal("an injected table name was accepted")
	}
	b := newSQLite(t)
	if _, err := b.process(context.Background(), inbox.Event{Consumer: "c"}, nil); err == nil {
		t.Fatal("an event without a correlation id was accepted")
	}
}

// TestMigrateAdoptsAndRunsConcurrently: tables a user created from Schema()
// (the same DDL, without a version table) are adopted as version 1
// with their rows, and eight inboxes migrating a fresh schema at once all
// succeed.
func TestMigrateAdoptsAndRunsConcurrently(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgSchema(t)
	driver := pgxv5.New(pool)
	cfg := inbox.Config{Table: schema + ".processed_events", VersionTable: schema + ".entity_versions"}
	first, err := inbox.New(driver, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The tables created by hand from Schema().
	if _, err := pool.Exec(ctx, first.Schema()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+cfg.Table+` (consumer, correlation_id, processed_at) VALUES ('c', 'PAY-old', now())`); err != nil {
		t.Fatal(err)
	}
	if err := first.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.idem_migrations WHERE component = $1 AND version = 1`, "inbox:"+cfg.Table).Scan(&n); err != nil || n != 1 {
		t.Fatalf("version 1 recorded %d times (%v)", n, err)
	}
	if out, err := first.Process(ctx, inbox.Event{Consumer: "c", CorrelationID: "PAY-old"}, func(context.Context, pgx.Tx) error { return nil }); err != nil || out != inbox.Duplicate {
		t.Fatalf("a key of the hand-made table: %v %v, want duplicate", out, err)
	}

	// Eight starts at once on a fresh schema.
	fresh := testenv.RandomName("idemtest_")
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+fresh+` CASCADE`) })
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ib, err := inbox.New(driver, inbox.Config{Table: fresh + ".processed_events", VersionTable: fresh + ".entity_versions"})
			if err == nil {
				err = ib.Migrate(ctx)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a concurrent start failed: %v", err)
		}
	}
}

// TestMySQLTableMadeByHand: an inbox table created by hand on MySQL whose
// keys compare without regard to case (varchar under the server's default
// collation) is refused at Migrate, naming the column — "ORD-1" and
// "ord-1" would be one key, and the second message dropped as the first's
// duplicate; one whose key columns compare byte for byte is adopted.
func TestMySQLTableMadeByHand(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		keyType string
		refused bool
	}{
		{"varchar(255) COLLATE utf8mb4_general_ci", true},
		{"varchar(255) COLLATE utf8mb4_bin", false},
		{"varbinary(255)", false},
	} {
		db := testenv.OpenMySQL(t, testenv.MySQLDatabase(t, ""))
		if _, err := db.ExecContext(ctx, `CREATE TABLE processed_events (consumer varbinary(255) NOT NULL, correlation_id `+c.keyType+` NOT NULL,
			event_type varbinary(255) NOT NULL DEFAULT '', processed_at datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			consumer_version varbinary(255) NOT NULL DEFAULT '', PRIMARY KEY (consumer, correlation_id))`); err != nil {
			t.Fatal(err)
		}
		ib, err := inbox.New(databasesql.New(db, sqldriver.MySQL), inbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		err = ib.Migrate(ctx)
		if c.refused != (err != nil) || c.refused && !strings.Contains(err.Error(), "processed_events.correlation_id") {
			t.Fatalf("correlation_id %s: Migrate: %v", c.keyType, err)
		}
	}
}
