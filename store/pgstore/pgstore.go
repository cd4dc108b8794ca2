package pgstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/internal/coalesce"
	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/internal/sqlmigrate"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/pgxv5"
	"github.com/idemgo/idem/store"
)

var (
	_ store.Store     = (*Store)(nil)
	_ store.Lister    = (*Store)(nil)
	_ store.Migrator  = (*Store)(nil)
	_ store.Archiver  = (*Store)(nil)
	_ store.Unclaimer = (*Store)(nil)
)

// Config configures a Store: New takes Pool, Open takes ConnString (or
// Pool).
type Config struct {
	// Pool is a pool you own (New; Close leaves it open). For PgBouncer in
	// transaction mode, configure it with DefaultQueryExecMode =
	// pgx.QueryExecModeExec.
	Pool *pgxpool.Pool
	// ConnString is a pgx connection string (postgres://… or key=value),
	// including pool settings such as pool_max_conns, from which Open
	// connects a pool of its own (Close closes it). Its writes commit
	// durably whatever the sessions' synchronous_commit — the server's
	// default, or its role's or database's, or one changed while the
	// program runs — as through a pool of yours (see New); a
	// synchronous_commit in the string is kept as it is (ServerWarnings
	// warns where that loses records).
	ConnString string
	// MaxConns sizes the pool Open connects when ConnString does not set
	// pool_max_conns. Defaults to DefaultMaxConns: pgx's own default
	// (max(4, NumCPU)) starves a store that many goroutines share — on a
	// 2-core machine 32 callers on 4 connections made 3,900 lifecycles/s
	// where 32 connections made 7,000. Size it to the number of goroutines
	// that call the store at once.
	MaxConns int32
	// Schema holds the tables. Defaults to the connection's search_path.
	Schema string
	// PgBouncer makes every statement work behind PgBouncer in transaction
	// mode: no named prepared statements (pgx QueryExecModeExec), no
	// session settings — where synchronous_commit is off when a write runs
	// (the server's default, turned off while the program runs, or a
	// session SET another client of the bouncer left on the server
	// connection), the write raises it to on for its own transaction
	// instead. Costs a little speed (statements parsed on every call).
	// Defaults to false.
	PgBouncer bool
	// SkipMigrate leaves the schema alone at Open (run Migrate yourself).
	SkipMigrate bool
	// Limits bound what the store accepts.
	Limits store.Limits
	// NoCoalesce makes every Acquire, Complete and Fail its own statement.
	// By default, calls that arrive while earlier ones are in flight join
	// the next round trip: one statement over arrays decides every key's
	// acquisition (or settle) at once, with the same outcome each would
	// have had alone. A call that finds the store idle runs alone at once.
	NoCoalesce bool
}

// DefaultMaxConns is the pool size Open chooses when neither the
// connection string nor Config.MaxConns sets one: 4 per CPU, at least 8 —
// each call holds a connection for one short round trip, so a few per core
// keep the server busy without queueing callers.
func DefaultMaxConns() int32 { return int32(max(8, 4*runtime.GOMAXPROCS(0))) }

// CountStates implements store.StateCounter: live records by state, one
// query (a scan of the table: an overview, not a hot path).
func (s *Store) CountStates(ctx context.Context) (map[store.State]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT state, count(*) FROM `+s.table+` WHERE expires_at > now() GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("idem/pgstore: count: %w", err)
	}
	defer rows.Close()
	out := map[store.State]int64{}
	for rows.Next() {
		var st int16
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("idem/pgstore: count: %w", err)
		}
		out[store.State(st)] = n
	}
	return out, rows.Err()
}

// CoalesceStats returns how many shared statements the store ran and how
// many calls they carried (zeros with Config.NoCoalesce): calls per
// statement is their ratio.
func (s *Store) CoalesceStats() (statements, calls int64) {
	if s.acquires == nil {
		return 0, 0
	}
	return coalesce.Sum(s.acquires, s.settles)
}

// PoolSize returns the most connections the store's pool opens.
func (s *Store) PoolSize() int32 { return s.pool.Config().MaxConns }

// Store is a PostgreSQL store.Store.
type Store struct {
	pool   *pgxpool.Pool
	owned  bool
	table  string
	schema string
	limits store.Limits
	// sql holds the statements on the records table: those that commit
	// durably (buildSQL), unless Open's connection string chose the
	// sessions' synchronous_commit; durably says which.
	sql     statements
	durably bool

	acquires *coalesce.Group[acquireCall, store.Acquisition] // nil: NoCoalesce
	settles  *coalesce.Group[settleCall, struct{}]
}

type statements struct {
	acquire, heartbeat, settle, release, unclaim, poisonClaim, get, del, delUpTo, sweep, list, archive string
	acquireMany, settleMany                                                                            string
	awaitArchives                                                                                      string
}

// Open connects a pool from cfg.ConnString (or uses cfg.Pool) and migrates
// the schema unless SkipMigrate. Close closes the pool it connected.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Pool != nil {
		if cfg.ConnString != "" {
			return nil, errors.New("idem/pgstore: Config.Pool and Config.ConnString are exclusive")
		}
		s, err := New(cfg)
		if err == nil && !cfg.SkipMigrate {
			err = s.Migrate(ctx)
		}
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	if cfg.ConnString == "" {
		return nil, errors.New("idem/pgstore: Config.ConnString (or Config.Pool) is required")
	}
	pc, err := pgxpool.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("idem/pgstore: Config.ConnString: %w", err)
	}
	if cfg.PgBouncer {
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	// Each write raises synchronous_commit for its own transaction where it
	// would lose the write (see New) — unless the connection string chose
	// the sessions' setting (behind PgBouncer it cannot: the server
	// connections are shared).
	_, chosen := pc.ConnConfig.RuntimeParams["synchronous_commit"]
	durably := cfg.PgBouncer || !chosen
	if !strings.Contains(cfg.ConnString, "pool_max_conns") {
		pc.MaxConns = cfg.MaxConns
		if pc.MaxConns <= 0 {
			pc.MaxConns = DefaultMaxConns()
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("idem/pgstore: %w", err)
	}
	s := newStore(pool, cfg.Schema, cfg.Limits, !cfg.NoCoalesce, durably)
	s.owned = true
	if !cfg.SkipMigrate {
		if err := s.Migrate(ctx); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return s, nil
}

// ServerWarnings reads the settings idem's promises depend on, as the
// store's sessions see them, and says what loses records. Where the
// connection string Open was given sets synchronous_commit, the store's
// writes keep it: off loses the last acknowledged claims and completions
// to a crash of the server, and local loses them to a failover where the
// server names synchronous standbys (synchronous_standby_names). Otherwise
// — Open's sessions, a pool of yours (Config.Pool), PgBouncer — the writes
// raise either for their own transactions, and there is nothing to warn
// of.
//
// It also names what loses records whatever the store does: a server
// whose fsync is off (a crash of the machine or a power loss loses or
// corrupts committed records), and standbys that replicate it
// asynchronously (pg_stat_replication, which only a superuser or a member
// of pg_read_all_stats sees in full): a failover to one loses the last
// acknowledged commits.
func (s *Store) ServerWarnings(ctx context.Context) ([]string, error) {
	var v, fsync, standbys string
	var async int
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('fsync'), current_setting('synchronous_standby_names'),
	(SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'async')`).Scan(&v, &fsync, &standbys, &async); err != nil {
		return nil, fmt.Errorf("idem/pgstore: read settings: %w", err)
	}
	var warnings []string
	if fsync == "off" {
		warnings = append(warnings, "fsync is off on the server: a crash of the machine or a power loss loses or corrupts committed records (claims, whose keys a second owner then runs beside the first, and completions, whose work then runs again); set fsync to on")
	}
	if async > 0 {
		warnings = append(warnings, fmt.Sprintf("%d standby(s) replicate the server asynchronously: a failover to one loses the last acknowledged claims (a second owner then runs a key beside the first) and completions (their work runs again); name the standbys a failover may promote in synchronous_standby_names", async))
	}
	switch {
	case s.durably:
	case v == "off":
		warnings = append(warnings, "synchronous_commit is off for the store's sessions: a crash of the server loses the last acknowledged claims (a second owner then runs a key beside the first) and completions (their work runs again); leave it out of the connection string, or set it to on")
	case v == "local" && standbys != "":
		warnings = append(warnings, "synchronous_commit is local for the store's sessions on a server with synchronous standbys ("+standbys+"): a failover to one loses the last acknowledged claims (a second owner then runs a key beside the first) and completions (their work runs again); leave it out of the connection string, or set it to on")
	}
	return warnings, nil
}

// New returns a store on cfg.Pool, without any I/O; Close leaves the pool
// open. Run Migrate (or Open) once before use. The pool's sessions take
// the server's (or role's, or database's) synchronous_commit, which may be
// off — PostgreSQL then acknowledges a commit before it is on disk — or
// local — before the synchronous standbys have it — or be changed while
// the program runs: each write raises either to on for its own
// transaction where the session has it when the statement runs (a
// condition in the statement: no round trip more, one read of the setting
// where it is kept), so that neither a crash of the server nor a failover
// to a synchronous standby loses anything acknowledged.
func New(cfg Config) (*Store, error) {
	if cfg.Pool == nil {
		return nil, errors.New("idem/pgstore: Config.Pool is required (Open connects from Config.ConnString)")
	}
	if cfg.ConnString != "" || cfg.PgBouncer {
		return nil, errors.New("idem/pgstore: Config.ConnString and Config.PgBouncer are Open's: configure the pool itself")
	}
	return newStore(cfg.Pool, cfg.Schema, cfg.Limits, !cfg.NoCoalesce, true), nil
}

func newStore(pool *pgxpool.Pool, schema string, limits store.Limits, coalesced, durably bool) *Store {
	s := &Store{pool: pool, table: tableOf(schema), schema: schema, limits: limits.WithDefaults()}
	s.sql, s.durably = buildSQL(s.table, durably), durably
	if coalesced {
		s.acquires = coalesce.New(coalesce.Config[acquireCall]{MaxBatch: maxBatch,
			Key: func(c acquireCall) string { return c.key }}, s.acquireOne, s.acquireMany)
		s.settles = coalesce.New(coalesce.Config[settleCall]{MaxBatch: maxBatch,
			Key: func(c settleCall) string { return c.key }}, s.settleOne, s.settleMany)
	}
	return s
}

// Pool returns the store's pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Schema returns the schema of the tables ("" for the search_path).
func (s *Store) Schema() string { return s.schema }

// Table returns the quoted, schema-qualified name of the records table.
func (s *Store) Table() string { return s.table }

// Statements returns the acquire and settle statements for the records table
// of schema ("" for the search_path), as the store runs them by default
// (their durability condition included: see New), for review and for
// benchmarking them with the server's own tools. Acquire takes $1 key, $2 fingerprint, $3 lease ms,
// $4 retention ms, $5 max attempts; settle takes $1 key, $2 fence, $3
// retention ms, $4 state, $5 result.
func Statements(schema string) (acquire, settle string) {
	st := statementsOf(schema)
	return st.acquire, st.settle
}

// BatchStatements returns the coalesced forms of Statements: one statement
// deciding many keys over arrays. Acquire takes $1 keys (bytea[]), $2
// fingerprints (bytea[]), $3 lease ms, $4 retention ms, $5 max attempts;
// settle takes $1 keys (sorted), $2 fences (int8[]), $3 retentions ms
// (float8[]), $4 states (int2[]), $5 results (bytea[]).
func BatchStatements(schema string) (acquire, settle string) {
	st := statementsOf(schema)
	return st.acquireMany, st.settleMany
}

func statementsOf(schema string) statements { return buildSQL(tableOf(schema), true) }

// tableOf is the quoted name of the records table of schema.
func tableOf(schema string) string {
	if schema == "" {
		return pgx.Identifier{"idem_records"}.Sanitize()
	}
	return pgx.Identifier{schema, "idem_records"}.Sanitize()
}

// expiryAfter is the SQL of the expiry ms milliseconds (an SQL expression)
// from now: for a retention of a minute or more, rounded up to the next
// whole second, so that a settle a moment after its acquire (the same
// retention, the same second) leaves expires_at, an indexed column, as it
// was, and PostgreSQL updates the row in place (HOT: no new index entries,
// the old version pruned from its page without VACUUM). A record is then
// kept up to a second longer than asked, never shorter; shorter retentions
// (tests, leases) are exact.
func expiryAfter(ms string) string {
	at := `now() + ` + ms + ` * interval '1 millisecond'`
	return `(CASE WHEN ` + ms + ` >= 60000 THEN to_timestamp(ceil(extract(epoch from ` + at + `))) ELSE ` + at + ` END)`
}

const recordCols = `k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at`

// buildSQL returns the statements on table, whose keys and fingerprints
// are packed (internal/keypack) as bytea. With durably, every statement
// that writes a record also makes its transaction commit durably where the
// session would acknowledge the commit before its WAL is on disk or on the
// synchronous standbys (synchronous_commit off or local:
// sqldriver.Postgres.Durably, a condition that raises it for the
// transaction, evaluated before any row is written).
func buildSQL(table string, durably bool) statements {
	// and is the condition the writing statements add to their WHERE.
	and := ""
	if durably {
		and = ` AND ` + sqldriver.Postgres.Durably()
	}
	// kt is the type of keys and fingerprints.
	const kt = "bytea"
	// The key's advisory lock (a 64-bit hash of the key, seeded by the
	// table's name), held until the transaction ends. Taken exclusively by
	// what removes a row or archives one (Delete, DeleteUpTo, a sweep — which
	// skips a key it cannot have at once — and an archive); shared by
	// acquisitions, before they read the clock for a new fence, and by the
	// reads awaiting archives. So an acquisition never waits inside its
	// INSERT for a delete of the key: had it, it would insert with a fence
	// read before the wait, below the fence of a claim taken and deleted
	// meanwhile (TestFenceGrowsAfterAnAcquireWaitedOnDeletes). A
	// collision with another key's hash only makes one wait for the other.
	lockOf := func(key string) string {
		return `hashtextextended(encode(` + key + `, 'hex'), ` + strconv.FormatInt(int64(fnv64(table)), 10) + `)`
	}
	keyLock := lockOf(`$1::` + kt)
	// locked is a CTE that takes the key's lock exclusively (the deletes'
	// and the archive's first).
	locked := `l AS MATERIALIZED (SELECT pg_advisory_xact_lock(` + keyLock + `))`
	const (
		expired  = `(r.expires_at <= now())`
		mismatch = `(r.fp <> EXCLUDED.fp)`
		live     = `(r.state = 1 AND r.lease_until > now())`
		settled  = `(r.state IN (2, 3, 4))`
		limit    = `($5::int > 0 AND r.attempts >= $5::int)`
		take     = `(` + expired + ` OR NOT (` + mismatch + ` OR ` + live + ` OR ` + settled + ` OR ` + limit + `))`
		poison   = `(NOT ` + expired + ` AND NOT ` + mismatch + ` AND NOT ` + live + ` AND NOT ` + settled + ` AND ` + limit + `)`
		leaseEnd = `(now() + $3::float8 * interval '1 millisecond')`
		// the fence floor: the server's clock in microseconds (store.FenceFloor)
		floor = `(extract(epoch from clock_timestamp()) * 1000000)::bigint`
	)
	keepEnd := expiryAfter(`$4::float8`)
	// lockedFloor is the fence floor read once the key's lock is held
	// shared.
	lockedFloor := func(lock string) string {
		return `(SELECT ` + floor + ` FROM (SELECT pg_advisory_xact_lock_shared(` + lock + `)) l)`
	}
	// The acquire's decision, for one row (the statement for one key) or for
	// many (over arrays of keys and fingerprints, in key order, so that two
	// statements never lock the same rows in opposite orders).
	onConflict := `
ON CONFLICT (k) DO UPDATE SET
	outcome = CASE WHEN ` + expired + ` THEN 1 WHEN ` + mismatch + ` THEN 5 WHEN ` + live + ` THEN 3
		WHEN r.state IN (2, 3) THEN 4 WHEN r.state = 4 THEN 6 WHEN ` + limit + ` THEN 6
		WHEN r.state = 1 THEN 2 ELSE 1 END,
	state = CASE WHEN ` + take + ` THEN 1 WHEN ` + poison + ` THEN 4 ELSE r.state END,
	fence = CASE WHEN ` + take + ` OR ` + poison + ` THEN greatest(r.fence + 1, ` + floor + `) ELSE r.fence END,
	fp = CASE WHEN ` + expired + ` THEN EXCLUDED.fp ELSE r.fp END,
	attempts = CASE WHEN ` + expired + ` THEN 1 WHEN ` + take + ` THEN r.attempts + 1 ELSE r.attempts END,
	result = CASE WHEN ` + expired + ` THEN NULL ELSE r.result END,
	lease_until = CASE WHEN ` + take + ` THEN ` + leaseEnd + ` ELSE r.lease_until END,
	expires_at = CASE WHEN ` + expired + ` THEN ` + keepEnd + `
		WHEN ` + take + ` OR ` + poison + ` THEN greatest(r.expires_at, ` + keepEnd + `) ELSE r.expires_at END,
	updated_at = CASE WHEN ` + take + ` OR ` + poison + ` THEN now() ELSE r.updated_at END
RETURNING outcome, ` + recordCols
	insert := `INSERT INTO ` + table + ` AS r (k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at, outcome)`
	return statements{
		// $1 key, $2 fingerprint, $3 lease ms, $4 unsettled retention ms, $5 max attempts
		// The fence floor is read after the key's lock is taken.
		acquire: insert + `
SELECT $1::` + kt + `, 1, ` + lockedFloor(keyLock) + `, $2::` + kt + `, 1, NULL::bytea, ` + leaseEnd + `, ` + keepEnd + `, now(), 1
WHERE true` + and + onConflict,
		// $1 keys, $2 fingerprints, $3-$5 as acquire's. Every key's lock is
		// taken (the rows are sorted whole) before the first row is written.
		acquireMany: insert + `
SELECT i.k, 1, ` + lockedFloor(lockOf(`i.k`)) + `, i.fp, 1, NULL, ` + leaseEnd + `, ` + keepEnd + `, now(), 1
FROM unnest($1::` + kt + `[], $2::` + kt + `[]) AS i(k, fp) WHERE true` + and + ` ORDER BY i.k` + onConflict,
		// $1 keys, $2 fences, $3 retentions ms, $4 states, $5 results.
		// Written as an upsert so that every row is found through the
		// primary key, whatever the planner knows of the table (a prepared
		// join planned while the table was small scans it whole until the
		// next ANALYZE). The proposed row carries the settle (its
		// lease_until the new expiry) and is born expired (at the epoch,
		// expired for every transaction): a key that is gone gets such a
		// row, which every statement treats as absent. The second column
		// tells a settled row (true) from such a placeholder. Rows go in
		// key order (see acquireMany).
		settleMany: insert + `
SELECT i.k, i.st, i.fence, ''::` + kt + `, 0, i.res, ` + expiryAfter(`i.keep`) + `, 'epoch'::timestamptz, now(), 0
FROM unnest($1::` + kt + `[], $2::int8[], $3::float8[], $4::int2[], $5::bytea[]) AS i(k, fence, keep, st, res) WHERE true` + and + ` ORDER BY i.k
ON CONFLICT (k) DO UPDATE SET state = EXCLUDED.state, result = EXCLUDED.result, lease_until = now(),
	expires_at = EXCLUDED.lease_until, updated_at = now()
WHERE r.fence = EXCLUDED.fence AND r.state = 1 AND r.expires_at > now()
RETURNING r.k, r.expires_at > now()`,
		// $1 key, $2 fence, $3 lease ms
		heartbeat: `UPDATE ` + table + ` SET lease_until = now() + $3::float8 * interval '1 millisecond',
	expires_at = greatest(expires_at, ` + expiryAfter(`$3::float8`) + `), updated_at = now()
WHERE k = $1::` + kt + ` AND fence = $2 AND state = 1 AND expires_at > now()` + and,
		// $1 key, $2 fence, $3 retention ms, $4 state, $5 result
		settle: `UPDATE ` + table + ` SET state = $4, result = $5, lease_until = now(),
	expires_at = ` + expiryAfter(`$3::float8`) + `, updated_at = now()
WHERE k = $1::` + kt + ` AND fence = $2 AND state = 1 AND expires_at > now()` + and,
		release: `UPDATE ` + table + ` SET state = 5, lease_until = now(), updated_at = now()
WHERE k = $1::` + kt + ` AND fence = $2 AND state = 1 AND expires_at > now()` + and,
		unclaim: `UPDATE ` + table + ` SET state = 5, lease_until = now(), updated_at = now(), attempts = greatest(attempts - 1, 0)
WHERE k = $1::` + kt + ` AND fence = $2 AND state = 1 AND expires_at > now()` + and,
		poisonClaim: `UPDATE ` + table + ` SET state = 4, lease_until = now(), updated_at = now(), attempts = greatest(attempts - 1, 0)
WHERE k = $1::` + kt + ` AND fence = $2 AND state = 1 AND expires_at > now()` + and,
		get: `SELECT ` + recordCols + ` FROM ` + table + ` WHERE k = $1::` + kt + ` AND expires_at > now()`,
		// The deletes take the key's lock before they touch its row (l is a
		// one-time filter, evaluated first).
		del: `WITH ` + locked + `
DELETE FROM ` + table + ` WHERE k = $1::` + kt + ` AND EXISTS (SELECT FROM l)` + and,
		delUpTo: `WITH ` + locked + `
DELETE FROM ` + table + ` WHERE k = $1::` + kt + ` AND fence <= $2 AND EXISTS (SELECT FROM l)` + and,
		// A sweep locks the rows it chose, then deletes those whose key's
		// lock it has at once: the others are left to the next sweep.
		sweep: `WITH c AS MATERIALIZED (SELECT k FROM ` + table + ` WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
DELETE FROM ` + table + ` WHERE k IN (SELECT c.k FROM c WHERE pg_try_advisory_xact_lock(` + lockOf(`c.k`) + `))`,
		list: `SELECT ` + recordCols + ` FROM ` + table + ` WHERE k > $1::` + kt + ` AND expires_at > now() ORDER BY k LIMIT $2`,
		// $1 key, $2 state, $3 fence, $4 fingerprint, $5 attempts, $6
		// result, $7 retention ms, $8 the caller's deadline (NULL: none).
		// Takes the key's lock (held until its transaction ends: after the
		// commit), then answers whether it came in time (read once, by the
		// database's clock) and the rows it wrote.
		archive: `WITH ` + locked + `,
t AS MATERIALIZED (SELECT $8::timestamptz IS NULL OR clock_timestamp() < $8::timestamptz AS in_time FROM l),
a AS (INSERT INTO ` + table + ` AS r (k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at, outcome)
SELECT $1::` + kt + `, $2::smallint, $3::bigint, $4::` + kt + `, $5::integer, $6::bytea, now(), ` + expiryAfter(`$7::float8`) + `, now(), 4
FROM t WHERE t.in_time` + and + `
ON CONFLICT (k) DO UPDATE SET state = EXCLUDED.state, fence = greatest(r.fence, EXCLUDED.fence), fp = EXCLUDED.fp,
	attempts = EXCLUDED.attempts, result = EXCLUDED.result, lease_until = now(),
	expires_at = EXCLUDED.expires_at, updated_at = now()
WHERE NOT (r.state IN (2, 3, 5) AND r.expires_at > now()
	AND (r.fence > EXCLUDED.fence OR (r.fence = EXCLUDED.fence AND EXCLUDED.state IN (2, 3))))
RETURNING 1)
SELECT (SELECT in_time FROM t), (SELECT count(*) FROM a)`,
		// $1 key: waits for the archives of the key under way.
		awaitArchives: `SELECT pg_advisory_xact_lock_shared(` + keyLock + `)`,
	}
}

// fnv64 is the 64-bit FNV-1a hash of s.
func fnv64(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// Migrations returns the numbered migrations of the records table. Version
// 1 creates the table: keys and fingerprints packed (internal/keypack) as
// bytea, the columns ordered so that a row has no padding, and room on
// each page for a settle's new row version (fillfactor 90), so that it is
// written in place (see expiryAfter).
func (s *Store) Migrations() []sqlmigrate.Step {
	idx := pgx.Identifier{"idem_records_expires_at"}.Sanitize()
	return []sqlmigrate.Step{{Version: 1, Name: "idempotency records", SQL: `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
		fence       bigint      NOT NULL,
		lease_until timestamptz NOT NULL,
		expires_at  timestamptz NOT NULL, -- never before lease_until
		updated_at  timestamptz NOT NULL,
		attempts    integer     NOT NULL,
		state       smallint    NOT NULL,
		outcome     smallint    NOT NULL, -- the outcome of the last acquire
		k           bytea       PRIMARY KEY,
		fp          bytea       NOT NULL DEFAULT '',
		result      bytea
	) WITH (fillfactor = 90);
	CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + s.table + ` (expires_at)`}}
}

// Migrate creates or upgrades the schema: the missing numbered migrations,
// in one transaction under an advisory lock (every idem migration takes the
// same one), recorded in idem_migrations. Any number of processes may run
// it at once; it is idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := sqlmigrate.Apply(ctx, pgxv5.New(s.pool), s.schema, "records", s.Migrations()); err != nil {
		return wrap("migrate", err)
	}
	return nil
}

// wrap maps pgx errors to idem's, keeping pgx's error in the chain
// (errors.As finds *pgconn.PgError): context errors pass through; a server
// that cannot be reached or cannot serve now (connection failures, SQLSTATE
// classes 08, 40, 53, 57 and 58, a read-only transaction after a failover)
// is ErrStoreUnavailable; anything else — a missing table, a missing
// privilege, a constraint — is returned as it is, for a retry will not help.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && !transient(pgErr.Code) {
		return fmt.Errorf("idem/pgstore: %s: %w", op, err)
	}
	return fmt.Errorf("%w: postgres %s: %w", store.ErrUnavailable, op, err)
}

// transient reports whether a SQLSTATE says the server may serve the same
// statement later.
func transient(code string) bool {
	if len(code) < 2 {
		return true
	}
	switch code[:2] {
	case "08", "40", "53", "57", "58":
		return true
	}
	return code == "25006" || code == "55P03" // read-only transaction; lock not available
}

// scanRecord reads recordCols (after extra) of row.
func (st *statements) scanRecord(row pgx.Row, extra ...any) (store.Record, error) {
	var r store.Record
	var key, fp []byte
	var state int16
	var fence int64
	var attempts int32
	var lease, exp, upd time.Time
	dest := append(extra, &key, &state, &fence, &fp, &attempts, &r.Result, &lease, &exp, &upd)
	if err := row.Scan(dest...); err != nil {
		return store.Record{}, err
	}
	r.Key, r.Fingerprint = keypack.Key(string(key)), keypack.UnpackFingerprint(string(fp))
	r.State, r.Fence, r.Attempts = store.State(state), uint64(fence), int(attempts)
	if r.State == store.StateInFlight {
		r.LeaseUntil = lease
	}
	r.ExpiresAt, r.UpdatedAt = exp, upd
	return r, nil
}

// Acquire implements store.Store with one statement, alone or shared with
// the calls that wait for the store at the same time (Config.NoCoalesce).
func (s *Store) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	if err := s.limits.CheckAcquire(req); err != nil {
		return store.Acquisition{}, err
	}
	c := acquireCall{key: req.Key, fp: req.Fingerprint, lease: req.Lease.Milliseconds(),
		keep: max(req.Retention, req.Lease).Milliseconds(), maxAttempts: int32(req.MaxAttempts)}
	if s.acquires == nil {
		return s.acquireOne(ctx, c)
	}
	return s.acquires.Do(ctx, c)
}

func (s *Store) acquireOne(ctx context.Context, c acquireCall) (store.Acquisition, error) {
	st := &s.sql
	var outcome int16
	rec, err := st.scanRecord(s.pool.QueryRow(ctx, st.acquire, keypack.KeyArg(c.key), keypack.FingerprintArg(c.fp), c.lease, c.keep, c.maxAttempts), &outcome)
	if err != nil {
		return store.Acquisition{}, wrap("acquire", err)
	}
	return acquisition(outcome, rec), nil
}

func acquisition(outcome int16, rec store.Record) store.Acquisition {
	a := store.Acquisition{Outcome: store.Outcome(outcome), Record: rec}
	if a.Outcome.Owns() {
		a.Fence = rec.Fence
	}
	return a
}

// exec runs the statement sql chooses with args, the first of them the
// storage key (a string), which it turns into the layout's argument in
// place (no second slice of arguments).
func (s *Store) exec(ctx context.Context, op string, sql func(*statements) string, args ...any) error {
	st := &s.sql
	args[0] = keypack.KeyArg(args[0].(string))
	tag, err := s.pool.Exec(ctx, sql(st), args...)
	if err != nil {
		return wrap(op, err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrStaleFence
	}
	return nil
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	if err := s.limits.CheckHeartbeat(key, lease); err != nil {
		return err
	}
	return s.exec(ctx, "heartbeat", func(st *statements) string { return st.heartbeat }, key, int64(fence), lease.Milliseconds())
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, "complete", key, fence, store.StateCompleted, result, retention)
}

// Fail implements store.Store.
func (s *Store) Fail(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, "fail", key, fence, store.StateFailed, result, retention)
}

func (s *Store) settle(ctx context.Context, op, key string, fence uint64, st store.State, result []byte, retention time.Duration) error {
	if err := s.limits.CheckSettle(key, result, retention); err != nil {
		return err
	}
	if result == nil {
		result = []byte{}
	}
	c := settleCall{key: key, fence: int64(fence), keep: retention.Milliseconds(), state: int16(st), result: result}
	if s.settles == nil {
		_, err := s.settleOne(ctx, c)
		return err
	}
	_, err := s.settles.Do(ctx, c)
	return err
}

func (s *Store) settleOne(ctx context.Context, c settleCall) (struct{}, error) {
	op := "complete"
	if c.state == int16(store.StateFailed) {
		op = "fail"
	}
	return struct{}{}, s.exec(ctx, op, func(st *statements) string { return st.settle }, c.key, c.fence, c.keep, c.state, c.result)
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.exec(ctx, "release", func(st *statements) string { return st.release }, key, int64(fence))
}

// Unclaim implements store.Unclaimer with one statement.
func (s *Store) Unclaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.exec(ctx, "unclaim", func(st *statements) string { return st.unclaim }, key, int64(fence))
}

// PoisonClaim implements store.Unclaimer with one statement.
func (s *Store) PoisonClaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.exec(ctx, "poison claim", func(st *statements) string { return st.poisonClaim }, key, int64(fence))
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Record{}, err
	}
	st := &s.sql
	rec, err := st.scanRecord(s.pool.QueryRow(ctx, st.get, keypack.KeyArg(key)))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Record{}, store.ErrNotFound
	}
	return rec, wrap("get", err)
}

// GetAwaitingArchives implements store.ArchiveAwaiter: Get that first waits
// for the archives of key under way (ArchiveStored), in one round trip. An
// archive takes an advisory lock of its key before it checks its deadline
// and holds it until its commit is visible; this read takes the lock
// shared, then reads with a snapshot of after it. So an archive that came
// in time but is applied late — it waited for the key's row, or its commit
// for the disk, after its caller gave up on it — is either seen or still
// ahead, waited for: a read past every archive's deadline never misses one
// that lands later. The wait ends with ctx.
func (s *Store) GetAwaitingArchives(ctx context.Context, key string) (store.Record, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Record{}, err
	}
	// One implicit transaction: the lock is released at its end, and the
	// read, a statement of its own, takes its snapshot after the lock.
	st := &s.sql
	var err error
	b := &pgx.Batch{}
	b.Queue(st.awaitArchives, keypack.KeyArg(key))
	b.Queue(st.get, keypack.KeyArg(key))
	br := s.pool.SendBatch(ctx, b)
	_, err = br.Exec()
	var rec store.Record
	if err == nil {
		rec, err = st.scanRecord(br.QueryRow())
	}
	// Close reports what failed the batch as a whole (the lock's wait
	// cancelled, the connection lost); a missing row is the read's own.
	if cerr := br.Close(); cerr != nil && (err == nil || errors.Is(err, pgx.ErrNoRows)) {
		err = cerr
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Record{}, store.ErrNotFound
	}
	return rec, wrap("get", err)
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	_, err := s.pool.Exec(ctx, s.sql.del, keypack.KeyArg(key))
	return wrap("delete", err)
}

// DeleteUpTo implements store.FencedDeleter.
func (s *Store) DeleteUpTo(ctx context.Context, key string, fence uint64) error {
	_, err := s.pool.Exec(ctx, s.sql.delUpTo, keypack.KeyArg(key), int64(fence))
	return wrap("delete", err)
}

// Sweep implements store.Store: it deletes up to limit expired records (1000
// when limit <= 0), oldest first, skipping rows another sweeper holds and
// keys an acquisition holds, in DELETEs of at most sweepChunk rows, each its
// own transaction: every key a DELETE takes holds an advisory lock until its
// commit (see buildSQL), and PostgreSQL's lock table is sized for about
// max_locks_per_transaction (64 by default) locks a connection. It stops at
// the first DELETE that finds fewer rows than it asked for. expires_at is
// never before lease_until, so a live lease is never deleted.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		limit = 1000
	}
	st := &s.sql
	swept := 0
	for swept < limit {
		n := min(sweepChunk, limit-swept)
		tag, err := s.pool.Exec(ctx, st.sweep, n)
		if err != nil {
			return swept, wrap("sweep", err)
		}
		swept += int(tag.RowsAffected())
		if tag.RowsAffected() < int64(n) {
			break
		}
	}
	return swept, nil
}

// sweepChunk bounds the rows of one sweep DELETE, and so the advisory locks
// its transaction holds.
const sweepChunk = 64

// List implements store.Lister.
func (s *Store) List(ctx context.Context, after string, limit int) ([]store.Record, error) {
	if limit <= 0 {
		limit = 1000
	}
	st := &s.sql
	rows, err := s.pool.Query(ctx, st.list, keypack.CursorArg(after), limit)
	if err != nil {
		return nil, wrap("list", err)
	}
	defer rows.Close()
	var out []store.Record
	for rows.Next() {
		r, err := st.scanRecord(rows)
		if err != nil {
			return nil, wrap("list", err)
		}
		out = append(out, r)
	}
	return out, wrap("list", rows.Err())
}

// Archive implements store.Archiver with one statement.
func (s *Store) Archive(ctx context.Context, rec store.Record, retention time.Duration) error {
	_, err := s.ArchiveStored(ctx, rec, retention)
	return err
}

// ArchiveStored implements store.StoredArchiver: the upsert's affected rows
// tell (none when its WHERE kept the row). Where ctx has a deadline, the
// archive is applied only if it reaches the database before it, by the
// database's clock: one held up on the way (a stalled network) past the
// point its caller was told it failed does not land later, beside what
// the caller did next — the tiered store lets the claim go
// (TestArchiveHeldUpPastItsDeadline). Otherwise ErrArchiveLate.
func (s *Store) ArchiveStored(ctx context.Context, rec store.Record, retention time.Duration) (bool, error) {
	if err := s.limits.CheckArchive(rec, retention); err != nil {
		return false, err
	}
	result := rec.Result
	if result == nil {
		result = []byte{}
	}
	var deadline *time.Time
	if d, ok := ctx.Deadline(); ok {
		deadline = &d
	}
	st := &s.sql
	var err error
	var inTime bool
	var stored int64
	err = s.pool.QueryRow(ctx, st.archive, keypack.KeyArg(rec.Key), int16(rec.State), int64(rec.Fence), keypack.FingerprintArg(rec.Fingerprint), int32(rec.Attempts), result,
		retention.Milliseconds(), deadline).Scan(&inTime, &stored)
	if err == nil && !inTime {
		return false, ErrArchiveLate
	}
	return err == nil && stored > 0, wrap("archive", err)
}

// ErrArchiveLate: an archive reached the database after its context's
// deadline and was not applied (ArchiveStored). It is ErrStoreUnavailable.
var ErrArchiveLate = fmt.Errorf("%w: idem/pgstore: the archive reached the database after its context's deadline and was not applied", store.ErrUnavailable)

// Close closes the pool if Open created it.
func (s *Store) Close() error {
	if s.owned {
		s.pool.Close()
	}
	return nil
}
