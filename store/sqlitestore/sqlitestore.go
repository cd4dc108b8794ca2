package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"modernc.org/sqlite" // the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/coalesce"
	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/internal/sqlmigrate"
	"github.com/idemgo/idem/internal/sqlrecord"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/store"
)

var (
	_ store.Store     = (*Store)(nil)
	_ store.Lister    = (*Store)(nil)
	_ store.Migrator  = (*Store)(nil)
	_ store.Archiver  = (*Store)(nil)
	_ store.Unclaimer = (*Store)(nil)
)

// Config configures a Store. Only Path is required.
type Config struct {
	// Path of the database file; created if missing.
	Path string
	// Synchronous is SQLite's synchronous setting: "NORMAL" (the default; in
	// WAL mode a power loss may lose the last commits but never corrupts) or
	// "FULL" (every commit is durable).
	Synchronous string
	// BusyTimeout is how long a statement waits for another process's write
	// lock. Defaults to 5s.
	BusyTimeout time.Duration
	// MaxConns bounds the connections of this process. Defaults to 1: SQLite
	// has one writer at a time, and one connection queues writers in process
	// instead of in SQLite's busy handler.
	MaxConns int
	// SkipMigrate leaves the schema alone at Open (run Migrate yourself).
	SkipMigrate bool
	// Clock tells the store's time. Defaults to the wall clock.
	Clock idem.Clock
	// Limits bound what the store accepts. Defaults to idem's defaults.
	Limits store.Limits
	// NoCoalesce makes every Acquire, Complete and Fail its own
	// transaction. By default, the calls that arrive while a write is in
	// flight share the next transaction (one commit: on synchronous=FULL,
	// one fsync), each its own statement, decided as alone; a call that
	// finds the store idle runs alone at once.
	NoCoalesce bool
}

// Store is a SQLite store.Store.
type Store struct {
	db     *sql.DB
	clock  idem.Clock
	limits store.Limits

	acquire, heartbeat, settle, release, unclaim, poisonClaim, get, del, delUpTo, sweep, list, archive *sql.Stmt
	closed                                                                                             atomic.Bool

	writes *coalesce.Group[writeCall, store.Acquisition] // nil: NoCoalesce
}

// Open opens (and by default migrates) the database at cfg.Path.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Path == "" {
		return nil, errors.New("idem/sqlitestore: Config.Path is required")
	}
	db, err := OpenDB(ctx, cfg.Path, DBOptions{Synchronous: cfg.Synchronous, BusyTimeout: cfg.BusyTimeout, MaxConns: cfg.MaxConns})
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, clock: cfg.Clock, limits: cfg.Limits.WithDefaults()}
	if s.clock == nil {
		s.clock = idem.SystemClock{}
	}
	if !cfg.SkipMigrate {
		if err := s.Migrate(ctx); err != nil {
			db.Close()
			return nil, err
		}
	}
	if err := s.prepare(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if !cfg.NoCoalesce {
		s.writes = s.newWrites()
	}
	return s, nil
}

// DB returns the underlying database, for the transactional inbox and
// operators.
func (s *Store) DB() *sql.DB { return s.db }

// Migrations returns the numbered migrations of the records table. Version
// 1 creates it: a STRICT table whose keys and fingerprints are packed BLOBs
// (internal/keypack: a compact key as its 16 bytes, a request digest as 17).
func Migrations() []sqlmigrate.Step {
	return []sqlmigrate.Step{{Version: 1, Name: "idempotency records", SQL: `CREATE TABLE IF NOT EXISTS idem_records (
		k           BLOB    PRIMARY KEY,
		state       INTEGER NOT NULL,
		fence       INTEGER NOT NULL,
		fp          BLOB    NOT NULL DEFAULT X'',
		attempts    INTEGER NOT NULL,
		result      BLOB,
		lease_until INTEGER NOT NULL, -- Unix ms
		expires_at  INTEGER NOT NULL, -- Unix ms; never before lease_until
		updated_at  INTEGER NOT NULL, -- Unix ms
		outcome     INTEGER NOT NULL  -- the outcome of the last Acquire
	) STRICT;
	CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);`}}
}

// Migrate creates or upgrades the schema: the missing numbered migrations,
// in one BEGIN IMMEDIATE transaction, recorded in idem_migrations. Any
// number of processes may run it at once; it is idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := sqlmigrate.Apply(ctx, databasesql.New(s.db, sqldriver.SQLite), "", "records", Migrations())
	return s.wrap("migrate", err)
}

// The acquire statement. Parameters: ?1 key, ?2 fingerprint, ?3 now (ms),
// ?4 lease (ms), ?5 unsettled retention (ms, at least the lease), ?6 max
// attempts (0 = none), ?7 the fence floor (see store.FenceFloor). In DO
// UPDATE, bare column names are the row as it was.
const (
	condExpired  = `(expires_at <= ?3)`
	condMismatch = `(fp <> ?2)`
	condLive     = `(state = 1 AND lease_until > ?3)`
	condSettled  = `(state IN (2, 3, 4))`
	condLimit    = `(?6 > 0 AND attempts >= ?6)`
	condTake     = `(` + condExpired + ` OR NOT (` + condMismatch + ` OR ` + condLive + ` OR ` + condSettled + ` OR ` + condLimit + `))`
	condPoison   = `(NOT ` + condExpired + ` AND NOT ` + condMismatch + ` AND NOT ` + condLive + ` AND NOT ` + condSettled + ` AND ` + condLimit + `)`
	recordCols   = sqlrecord.Columns
)

// floorAtExecution is the fence floor of the moment the statement runs,
// not of its call: a call may wait for another process's write lock while
// that process issues fences. SQLite's clock has milliseconds; rounding up
// to the next one keeps the floor above every fence issued before (each at
// most the microseconds of its own moment).
const floorAtExecution = `((` + msAtExecution + ` + 1) * 1000)`

// msAtExecution is the wall clock (Unix ms) when the statement runs.
const msAtExecution = `CAST(unixepoch('subsec') * 1000 AS INTEGER)`

var acquireSQL = `INSERT INTO idem_records (k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at, outcome)
VALUES (?1, 1, max(?7, ` + floorAtExecution + `), ?2, 1, NULL, ?3 + ?4, ?3 + ?5, ?3, 1)
ON CONFLICT (k) DO UPDATE SET
	outcome = CASE WHEN ` + condExpired + ` THEN 1 WHEN ` + condMismatch + ` THEN 5 WHEN ` + condLive + ` THEN 3
		WHEN state IN (2, 3) THEN 4 WHEN state = 4 THEN 6 WHEN ` + condLimit + ` THEN 6
		WHEN state = 1 THEN 2 ELSE 1 END,
	state = CASE WHEN ` + condTake + ` THEN 1 WHEN ` + condPoison + ` THEN 4 ELSE state END,
	fence = CASE WHEN ` + condTake + ` OR ` + condPoison + ` THEN max(fence + 1, ?7, ` + floorAtExecution + `) ELSE fence END,
	fp = CASE WHEN ` + condExpired + ` THEN ?2 ELSE fp END,
	attempts = CASE WHEN ` + condExpired + ` THEN 1 WHEN ` + condTake + ` THEN attempts + 1 ELSE attempts END,
	result = CASE WHEN ` + condExpired + ` THEN NULL ELSE result END,
	lease_until = CASE WHEN ` + condTake + ` THEN ?3 + ?4 ELSE lease_until END,
	expires_at = CASE WHEN ` + condExpired + ` THEN ?3 + ?5
		WHEN ` + condTake + ` OR ` + condPoison + ` THEN max(expires_at, ?3 + ?5) ELSE expires_at END,
	updated_at = CASE WHEN ` + condTake + ` OR ` + condPoison + ` THEN ?3 ELSE updated_at END
RETURNING outcome, ` + recordCols

func (s *Store) prepare(ctx context.Context) error {
	stmts := []struct {
		dst **sql.Stmt
		sql string
	}{
		{&s.acquire, acquireSQL},
		// ?1 key, ?2 fence, ?3 now, ?4 lease ms
		{&s.heartbeat, `UPDATE idem_records SET lease_until = ?3 + ?4, expires_at = max(expires_at, ?3 + ?4), updated_at = ?3
			WHERE k = ?1 AND fence = ?2 AND state = 1 AND expires_at > ?3`},
		// ?1 key, ?2 fence, ?3 now, ?4 retention ms, ?5 state, ?6 result
		{&s.settle, `UPDATE idem_records SET state = ?5, result = ?6, lease_until = 0, expires_at = ?3 + ?4, updated_at = ?3
			WHERE k = ?1 AND fence = ?2 AND state = 1 AND expires_at > ?3`},
		{&s.release, `UPDATE idem_records SET state = 5, lease_until = 0, updated_at = ?3
			WHERE k = ?1 AND fence = ?2 AND state = 1 AND expires_at > ?3`},
		{&s.unclaim, `UPDATE idem_records SET state = 5, lease_until = 0, updated_at = ?3, attempts = max(attempts - 1, 0)
			WHERE k = ?1 AND fence = ?2 AND state = 1 AND expires_at > ?3`},
		{&s.poisonClaim, `UPDATE idem_records SET state = 4, lease_until = 0, updated_at = ?3, attempts = max(attempts - 1, 0)
			WHERE k = ?1 AND fence = ?2 AND state = 1 AND expires_at > ?3`},
		{&s.get, `SELECT ` + recordCols + ` FROM idem_records WHERE k = ?1 AND expires_at > ?2`},
		// ?1 key: a deleted record stays as an expired row that keeps its
		// fence (see deleted).
		{&s.del, `UPDATE idem_records SET ` + deleted + ` WHERE k = ?1`},
		// ?1 key, ?2 fence.
		{&s.delUpTo, `UPDATE idem_records SET ` + deleted + ` WHERE k = ?1 AND fence <= ?2`},
		// ?1 now (ms), ?2 limit. The row of a deleted record goes only once
		// the millisecond of its Delete has passed (see deleted). It
		// answers each row's outcome, 0 for a deleted record's (not
		// counted: Delete removed the record).
		{&s.sweep, `DELETE FROM idem_records WHERE k IN (SELECT k FROM idem_records
			WHERE expires_at < ?1 AND (outcome <> 0 OR updated_at < ` + msAtExecution + `) LIMIT ?2) RETURNING outcome`},
		{&s.list, `SELECT ` + recordCols + ` FROM idem_records WHERE k > ?1 AND expires_at > ?2 ORDER BY k LIMIT ?3`},
		// ?1 key, ?2 state, ?3 fence, ?4 fp, ?5 attempts, ?6 result, ?7 now, ?8 retention ms
		{&s.archive, `INSERT INTO idem_records (k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at, outcome)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7 + ?8, ?7, 4)
			ON CONFLICT (k) DO UPDATE SET state = excluded.state, fence = max(fence, excluded.fence), fp = excluded.fp,
				attempts = excluded.attempts, result = excluded.result, lease_until = 0,
				expires_at = excluded.expires_at, updated_at = excluded.updated_at, outcome = 4
			WHERE NOT (state IN (2, 3, 5) AND expires_at > ?7
				AND (fence > excluded.fence OR (fence = excluded.fence AND excluded.state IN (2, 3))))`},
	}
	for _, st := range stmts {
		p, err := s.db.PrepareContext(ctx, st.sql)
		if err != nil {
			return fmt.Errorf("idem/sqlitestore: prepare: %w", err)
		}
		*st.dst = p
	}
	return nil
}

// deleted is what Delete and DeleteUpTo set: the record expired at the epoch, so no call
// sees it whatever its clock says, but its row stays and keeps its fence,
// from which the key's next claim counts up, until a sweep after the
// millisecond in which the Delete ran (updated_at). Removing the row at
// once let a claim within the same millisecond take the fence floor again
// (SQLite's clock has milliseconds: every claim on an empty key in one
// millisecond takes the same floor) — the deleted claim's fence, under
// which its owner's calls were then accepted on the new claim. Expiring it
// at the Delete's own time instead left it as a released record to a call
// of another process whose clock reading came a little before the Delete
// (taken before it waited for the write lock): that call counted the
// deleted generation's attempts on, or saw its fingerprint.
const deleted = `state = 5, result = NULL, lease_until = 0, expires_at = 0, updated_at = ` + msAtExecution + `, outcome = 0`

// fences is shared by every Store of the process, so fences stay strictly
// increasing even for a file opened twice and with an injected clock;
// between processes on one file, the floor of the moment the statement runs
// (SQLite's clock, floorAtExecution) keeps them growing.
var fences store.FenceSequence

func (s *Store) nowMs() int64 { return s.clock.Now().UnixMilli() }

// wrap maps driver errors to idem's, keeping the driver's error in the chain
// (errors.As finds *sqlite.Error): context errors pass through; after Close,
// ErrClosed; a busy, locked, I/O, full or unopenable database is
// ErrStoreUnavailable (it may work again); anything else — a missing table,
// a read-only file, a constraint — is returned as it is, for it will not.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if s.closed.Load() || errors.Is(err, sql.ErrConnDone) {
		return fmt.Errorf("%w: sqlite %s: %w", store.ErrClosed, op, err)
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL:
		default:
			return fmt.Errorf("idem/sqlitestore: %s: %w", op, err)
		}
	}
	return fmt.Errorf("%w: sqlite %s: %w", store.ErrUnavailable, op, err)
}

// Acquire implements store.Store with one statement, alone or in a
// transaction shared with the calls that wait for the store at the same
// time (Config.NoCoalesce).
func (s *Store) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	if err := s.limits.CheckAcquire(req); err != nil {
		return store.Acquisition{}, err
	}
	return s.write(ctx, writeCall{acquire: true, key: req.Key, fp: req.Fingerprint, lease: req.Lease.Milliseconds(),
		keep: max(req.Retention, req.Lease).Milliseconds(), maxAttempts: req.MaxAttempts})
}

func (s *Store) acquireWith(ctx context.Context, st *sql.Stmt, c *writeCall) (store.Acquisition, error) {
	t := s.clock.Now()
	var outcome int
	rec, err := sqlrecord.Scan(st.QueryRowContext(ctx, keypack.KeyArg(c.key), keypack.FingerprintArg(c.fp), t.UnixMilli(), c.lease, c.keep, c.maxAttempts,
		int64(fences.Next(t, 0))), &outcome)
	if err != nil {
		return store.Acquisition{}, s.wrap("acquire", err)
	}
	a := store.Acquisition{Outcome: store.Outcome(outcome), Record: rec}
	if a.Outcome.Owns() {
		a.Fence = rec.Fence
	}
	return a, nil
}

func (s *Store) owned(ctx context.Context, op string, st *sql.Stmt, args ...any) error {
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return s.wrap(op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return s.wrap(op, err)
	}
	if n == 0 {
		return store.ErrStaleFence
	}
	return nil
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	if err := s.limits.CheckHeartbeat(key, lease); err != nil {
		return err
	}
	return s.owned(ctx, "heartbeat", s.heartbeat, keypack.KeyArg(key), int64(fence), s.nowMs(), lease.Milliseconds())
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settleAs(ctx, "complete", key, fence, store.StateCompleted, result, retention)
}

// Fail implements store.Store.
func (s *Store) Fail(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settleAs(ctx, "fail", key, fence, store.StateFailed, result, retention)
}

func (s *Store) settleAs(ctx context.Context, op, key string, fence uint64, st store.State, result []byte, retention time.Duration) error {
	if err := s.limits.CheckSettle(key, result, retention); err != nil {
		return err
	}
	if result == nil {
		result = []byte{}
	}
	_, err := s.write(ctx, writeCall{key: key, fence: int64(fence), keep: retention.Milliseconds(), state: int(st), result: result, op: op})
	return err
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.owned(ctx, "release", s.release, keypack.KeyArg(key), int64(fence), s.nowMs())
}

// Unclaim implements store.Unclaimer with one statement.
func (s *Store) Unclaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.owned(ctx, "unclaim", s.unclaim, keypack.KeyArg(key), int64(fence), s.nowMs())
}

// PoisonClaim implements store.Unclaimer with one statement.
func (s *Store) PoisonClaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.owned(ctx, "poison claim", s.poisonClaim, keypack.KeyArg(key), int64(fence), s.nowMs())
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Record{}, err
	}
	rec, err := sqlrecord.Scan(s.get.QueryRowContext(ctx, keypack.KeyArg(key), s.nowMs()))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Record{}, store.ErrNotFound
	}
	return rec, s.wrap("get", err)
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	_, err := s.del.ExecContext(ctx, keypack.KeyArg(key))
	return s.wrap("delete", err)
}

// DeleteUpTo implements store.FencedDeleter.
func (s *Store) DeleteUpTo(ctx context.Context, key string, fence uint64) error {
	_, err := s.delUpTo.ExecContext(ctx, keypack.KeyArg(key), int64(fence))
	return s.wrap("delete", err)
}

// Sweep implements store.Store: one DELETE of up to limit expired rows (no
// limit when limit <= 0). It counts the records past their retention; the
// rows that deleted records leave (see deleted) go too, uncounted.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		limit = -1
	}
	rows, err := s.sweep.QueryContext(ctx, s.nowMs(), limit)
	if err != nil {
		return 0, s.wrap("sweep", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var outcome int
		if err := rows.Scan(&outcome); err != nil {
			return n, s.wrap("sweep", err)
		}
		if outcome != 0 {
			n++
		}
	}
	return n, s.wrap("sweep", rows.Err())
}

// List implements store.Lister.
func (s *Store) List(ctx context.Context, after string, limit int) ([]store.Record, error) {
	if limit <= 0 {
		limit = -1
	}
	rows, err := s.list.QueryContext(ctx, keypack.CursorArg(after), s.nowMs(), limit)
	if err != nil {
		return nil, s.wrap("list", err)
	}
	defer rows.Close()
	var out []store.Record
	for rows.Next() {
		r, err := sqlrecord.Scan(rows)
		if err != nil {
			return nil, s.wrap("list", err)
		}
		out = append(out, r)
	}
	return out, s.wrap("list", rows.Err())
}

// CountStates implements store.StateCounter: live records by state, one
// query.
func (s *Store) CountStates(ctx context.Context) (map[store.State]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT state, count(*) FROM idem_records WHERE expires_at > ? GROUP BY state`, s.nowMs())
	if err != nil {
		return nil, s.wrap("count", err)
	}
	defer rows.Close()
	out := map[store.State]int64{}
	for rows.Next() {
		var st, n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, s.wrap("count", err)
		}
		out[store.State(st)] = n
	}
	return out, s.wrap("count", rows.Err())
}

// Archive implements store.Archiver with one statement.
func (s *Store) Archive(ctx context.Context, rec store.Record, retention time.Duration) error {
	_, err := s.ArchiveStored(ctx, rec, retention)
	return err
}

// ArchiveStored implements store.StoredArchiver: the statement's changed
// rows tell.
func (s *Store) ArchiveStored(ctx context.Context, rec store.Record, retention time.Duration) (bool, error) {
	if err := s.limits.CheckArchive(rec, retention); err != nil {
		return false, err
	}
	result := rec.Result
	if result == nil {
		result = []byte{}
	}
	res, err := s.archive.ExecContext(ctx, keypack.KeyArg(rec.Key), int(rec.State), int64(rec.Fence), keypack.FingerprintArg(rec.Fingerprint), rec.Attempts, result, s.nowMs(), retention.Milliseconds())
	if err != nil {
		return false, s.wrap("archive", err)
	}
	n, err := res.RowsAffected()
	return n > 0, s.wrap("archive", err)
}

// Close closes the database.
func (s *Store) Close() error {
	s.closed.Store(true)
	return s.db.Close()
}
