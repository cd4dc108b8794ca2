package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/coalesce"
	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/internal/redact"
	"github.com/idemgo/idem/internal/sqlmigrate"
	"github.com/idemgo/idem/internal/sqlrecord"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/store"
)

var (
	_ store.Store         = (*Store)(nil)
	_ store.Lister        = (*Store)(nil)
	_ store.StateCounter  = (*Store)(nil)
	_ store.Migrator      = (*Store)(nil)
	_ store.Unclaimer     = (*Store)(nil)
	_ store.FencedDeleter = (*Store)(nil)
)

// Config configures a Store. DSN is required.
type Config struct {
	// DSN names the server and the database, as go-sql-driver/mysql reads
	// it ("user:password@tcp(host:3306)/db?tls=true"), or as a URL
	// ("mysql://user:password@host:3306/db?tls=true", see ParseURL). The
	// store sets the driver options it relies on itself (several statements
	// in one query, parameters interpolated by the client, matched rather
	// than changed rows counted, UTC).
	DSN string
	// MaxConns bounds the store's connections. Defaults to 16.
	MaxConns int
	// SkipMigrate leaves the schema alone at Open (run Migrate yourself).
	SkipMigrate bool
	// Clock tells the store's time. Defaults to the wall clock.
	Clock idem.Clock
	// Limits bound what the store accepts. Defaults to idem's defaults.
	Limits store.Limits
	// NoCoalesce makes every Acquire, Complete and Fail its own round trip
	// and commit. By default, the calls that arrive while the store is busy
	// share the next round trip — one transaction, one commit, each call its
	// own statements, decided as if alone.
	NoCoalesce bool
}

// Store is a MySQL or MariaDB store.Store.
type Store struct {
	db     *sql.DB
	clock  idem.Clock
	limits store.Limits
	closed atomic.Bool
	server string                                        // VERSION()
	writes *coalesce.Group[writeCall, store.Acquisition] // nil: NoCoalesce
}

// ParseURL turns a mysql://USER:PASSWORD@HOST:PORT/DB?PARAMS URL into the
// driver's configuration: the port defaults to 3306, the database is
// required, and every parameter is the driver's own (tls=true,
// tls=skip-verify, timeout=5s, …).
func ParseURL(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("idem/mysqlstore: %w", redact.ParseError(err))
	}
	if u.Scheme != "mysql" {
		return nil, fmt.Errorf("idem/mysqlstore: %s: the scheme is not mysql://", redact.URL(raw))
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, fmt.Errorf("idem/mysqlstore: %s names no database (mysql://USER:PASSWORD@HOST:PORT/DATABASE)", redact.URL(raw))
	}
	host := u.Host
	if host == "" {
		return nil, fmt.Errorf("idem/mysqlstore: %s names no host", redact.URL(raw))
	}
	if u.Port() == "" {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "3306")
	}
	dsn := "tcp(" + host + ")/" + db
	if u.User != nil {
		pass, _ := u.User.Password()
		dsn = u.User.Username() + ":" + pass + "@" + dsn
	}
	if u.RawQuery != "" {
		dsn += "?" + u.RawQuery
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("idem/mysqlstore: %s: %v", redact.URL(raw), err)
	}
	return cfg, nil
}

// driverConfig reads cfg.DSN and sets the options the store relies on.
func driverConfig(dsn string) (*mysql.Config, error) {
	var mc *mysql.Config
	var err error
	if strings.HasPrefix(dsn, "mysql://") {
		mc, err = ParseURL(dsn)
	} else if mc, err = mysql.ParseDSN(dsn); err != nil {
		err = fmt.Errorf("idem/mysqlstore: the DSN does not parse: %v", err)
	}
	if err != nil {
		return nil, err
	}
	if mc.DBName == "" {
		return nil, errors.New("idem/mysqlstore: the DSN names no database")
	}
	mc.Logger = quiet{}         // errors are returned; the driver's own log lines would repeat them
	mc.MultiStatements = true   // a claim and its read-back, in one round trip
	mc.InterpolateParams = true // one round trip a statement, no server-side prepare
	mc.ClientFoundRows = true   // rows matched, not changed: a fenced write that changes nothing still counts
	if mc.Params == nil {
		mc.Params = map[string]string{}
	}
	mc.Params["time_zone"] = "'+00:00'"
	return mc, nil
}

type quiet struct{}

func (quiet) Print(...any) {}

// Open connects (and by default migrates) the store.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.DSN == "" {
		return nil, errors.New("idem/mysqlstore: Config.DSN is required")
	}
	mc, err := driverConfig(cfg.DSN)
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("idem/mysqlstore: %v", err)
	}
	db := sql.OpenDB(conn)
	conns := cfg.MaxConns
	if conns <= 0 {
		conns = 16
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s := &Store{db: db, clock: cfg.Clock, limits: cfg.Limits.WithDefaults()}
	if s.clock == nil {
		s.clock = idem.SystemClock{}
	}
	if err := s.checkServer(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if !cfg.SkipMigrate {
		if err := s.Migrate(ctx); err != nil {
			db.Close()
			return nil, err
		}
	}
	if !cfg.NoCoalesce {
		s.writes = s.newWrites()
	}
	return s, nil
}

// DB returns the store's database (opened with the options above).
func (s *Store) DB() *sql.DB { return s.db }

// checkServer refuses a server older than MySQL 8.0 or MariaDB 10.6, the
// first with SKIP LOCKED, saying which it found.
func (s *Store) checkServer(ctx context.Context) error {
	if err := s.db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&s.server); err != nil {
		return s.wrap("connect", err)
	}
	if err := sqldriver.CheckMySQLServer(s.server); err != nil {
		return fmt.Errorf("idem/mysqlstore: %w", err)
	}
	return nil
}

// MariaDB reports whether the server is MariaDB rather than MySQL.
func (s *Store) MariaDB() bool { return strings.Contains(strings.ToLower(s.server), "mariadb") }

// Migrations returns the numbered migrations of the records table. Version
// 1 creates it.
func Migrations() []sqlmigrate.Step {
	return []sqlmigrate.Step{{Version: 1, Name: "idempotency records", SQL: `CREATE TABLE IF NOT EXISTS idem_records (
	k           varbinary(520) NOT NULL PRIMARY KEY, -- the packed storage key
	state       tinyint        NOT NULL,
	fence       bigint         NOT NULL,
	fp          varbinary(130) NOT NULL DEFAULT '',
	attempts    int            NOT NULL,
	result      longblob,
	lease_until bigint         NOT NULL, -- Unix ms
	expires_at  bigint         NOT NULL, -- Unix ms; never before lease_until
	updated_at  bigint         NOT NULL, -- Unix ms
	outcome     tinyint        NOT NULL, -- the outcome of the last Acquire; 0 once deleted
	KEY idem_records_expires_at (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 ROW_FORMAT=DYNAMIC`}}
}

// columns is the layout Migrations creates: a table created otherwise (by
// hand, with other types) is refused at Migrate, by column.
var columns = map[string]string{
	"k": "varbinary", "state": "tinyint", "fence": "bigint", "fp": "varbinary", "attempts": "int", "result": "longblob",
	"lease_until": "bigint", "expires_at": "bigint", "updated_at": "bigint", "outcome": "tinyint",
}

// Migrate creates or upgrades the schema: the missing numbered migrations,
// under the server's named lock idem_migrate (GET_LOCK), recorded in
// idem_migrations; then it checks the table's columns. Any number of
// processes may run it at once; it is idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := sqlmigrate.Apply(ctx, databasesql.New(s.db, sqldriver.MySQL), "", "records", Migrations()); err != nil {
		return s.wrap("migrate", err)
	}
	return s.checkLayout(ctx)
}

func (s *Store) checkLayout(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, `SELECT column_name, data_type FROM information_schema.columns
		WHERE table_schema = DATABASE() AND table_name = 'idem_records'`)
	if err != nil {
		return s.wrap("migrate", err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return s.wrap("migrate", err)
		}
		name, typ = strings.ToLower(name), strings.ToLower(typ)
		if want, ok := columns[name]; ok && want != typ {
			return fmt.Errorf("idem/mysqlstore: idem_records.%s is %s, not %s: the table was not created by idem's migration (drop it, or alter the column)", name, typ, want)
		}
		seen[name] = true
	}
	if err := rows.Err(); err != nil {
		return s.wrap("migrate", err)
	}
	for name, typ := range columns {
		if !seen[name] {
			return fmt.Errorf("idem/mysqlstore: idem_records has no column %s (%s): the table was not created by idem's migration", name, typ)
		}
	}
	return nil
}

// The statements. Their parameters are written :name; stmt turns them into
// MySQL's ? with the arguments in order (see bind). Times are Unix ms.
const (
	// taken: the outcome the statement just set says the call takes the
	// key (Acquired, TakenOver); poisoned: it hit the attempt limit now
	// (state is still the row's old state where this is read).
	taken      = `(outcome IN (1, 2))`
	poisonedIt = `(outcome = 6 AND state <> 4)`
	recordCols = sqlrecord.Columns
	// msAtExecution is the server's clock (Unix ms) when the statement
	// runs; floorAtExecution the fence floor of that moment (microseconds,
	// plus one: above every fence issued before it).
	msAtExecution    = `CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)`
	floorAtExecution = `(CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED) + 1)`
)

// acquireHead and acquireUpdate make the statement that claims or
// interrogates keys of one MaxAttempts (acquireSQL): one row of values per
// key, then ON DUPLICATE KEY UPDATE, in which each existing row's own
// values stand for the call's: VALUES(fp) its fingerprint,
// VALUES(lease_until) the end of its lease, VALUES(expires_at) of its
// unsettled retention, VALUES(fence) its fence floor. MySQL assigns the
// update's columns left to right, each seeing the ones before it as
// already assigned: outcome comes first, decided from the row as it was,
// and the others follow from it, state last.
const (
	acquireHead = `INSERT INTO idem_records (k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at, outcome) VALUES `
	acquireRow  = `(?, 1, GREATEST(?, ` + floorAtExecution + `), ?, 1, NULL, ?, ?, ?, 1)`
	// The update's parameters: now (four times), MaxAttempts (twice).
	acquireUpdate = `
ON DUPLICATE KEY UPDATE
	outcome = CASE WHEN expires_at <= ? THEN 1 WHEN fp <> VALUES(fp) THEN 5 WHEN state = 1 AND lease_until > ? THEN 3
		WHEN state IN (2, 3) THEN 4 WHEN state = 4 THEN 6 WHEN ? > 0 AND attempts >= ? THEN 6
		WHEN state = 1 THEN 2 ELSE 1 END,
	fence = CASE WHEN ` + taken + ` OR ` + poisonedIt + ` THEN GREATEST(fence + 1, VALUES(fence)) ELSE fence END,
	fp = CASE WHEN expires_at <= ? THEN VALUES(fp) ELSE fp END,
	attempts = CASE WHEN expires_at <= ? THEN 1 WHEN ` + taken + ` THEN attempts + 1 ELSE attempts END,
	result = CASE WHEN expires_at <= ? THEN NULL ELSE result END,
	lease_until = CASE WHEN ` + taken + ` THEN VALUES(lease_until) ELSE lease_until END,
	updated_at = CASE WHEN ` + taken + ` OR ` + poisonedIt + ` THEN VALUES(updated_at) ELSE updated_at END,
	expires_at = CASE WHEN expires_at <= ? THEN VALUES(expires_at)
		WHEN ` + taken + ` OR ` + poisonedIt + ` THEN GREATEST(expires_at, VALUES(expires_at)) ELSE expires_at END,
	state = CASE WHEN ` + taken + ` THEN 1 WHEN ` + poisonedIt + ` THEN 4 ELSE state END`
)

// acquireSQL appends to b the claim of calls (acquisitions of one
// MaxAttempts, in key order) and its read-back, and their arguments to
// args. The read-back is a locking read of the rows the claim holds
// locked: a plain SELECT would read the transaction's REPEATABLE READ
// snapshot, taken at the first read of a shared round trip, and where the
// claim changed nothing (an answer equal to the last one) show a row as it
// was before a later commit.
func acquireSQL(b *strings.Builder, args []any, calls []*writeCall, now int64, floor func() int64) []any {
	b.WriteString(acquireHead)
	for i, c := range calls {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(acquireRow)
		args = append(args, keypack.KeyArg(c.key), floor(), keypack.FingerprintArg(c.fp), now+c.lease, now+c.keep, now)
	}
	b.WriteString(acquireUpdate)
	maxAttempts := calls[0].maxAttempts
	args = append(args, now, now, maxAttempts, maxAttempts, now, now, now, now)
	b.WriteString(";\nSELECT outcome, " + recordCols + " FROM idem_records WHERE k IN ")
	args = keyList(b, args, calls)
	b.WriteString(" ORDER BY k FOR UPDATE;\n")
	return args
}

// keyList appends to b the list of calls' keys, (?, ?, …), and the keys to
// args.
func keyList(b *strings.Builder, args []any, calls []*writeCall) []any {
	b.WriteByte('(')
	for i, c := range calls {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('?')
		args = append(args, keypack.KeyArg(c.key))
	}
	b.WriteByte(')')
	return args
}

// settleManySQL appends to b the settle of calls (Complete, Fail; in key
// order, at most one per key) as one UPDATE, and the read-back of the keys
// it settled, and their arguments to args. Each row is settled only under
// its call's fence while in flight and unexpired, as settleSQL does; a row
// it settles gets mark (a number of the round trip's own, below zero) in
// lease_until — which means nothing once a record is settled — so the
// read-back tells the calls that took effect from those that did not.
func settleManySQL(b *strings.Builder, args []any, calls []*writeCall, now, mark int64) []any {
	column := func(name string, value func(c *writeCall) any) {
		b.WriteString(name + "CASE k")
		for _, c := range calls {
			b.WriteString(" WHEN ? THEN ?")
			args = append(args, keypack.KeyArg(c.key), value(c))
		}
		b.WriteString(" END")
	}
	b.WriteString("UPDATE idem_records SET ")
	column("state = ", func(c *writeCall) any { return c.state })
	b.WriteString(", ")
	column("result = ", func(c *writeCall) any { return c.result })
	b.WriteString(", ")
	column("expires_at = ", func(c *writeCall) any { return now + c.keep })
	b.WriteString(", lease_until = ?, updated_at = ?\nWHERE k IN ")
	args = keyList(b, append(args, mark, now), calls)
	b.WriteString(" AND state = 1 AND expires_at > ? AND ")
	args = append(args, now)
	column("fence = ", func(c *writeCall) any { return c.fence })
	b.WriteString(";\nSELECT k FROM idem_records WHERE lease_until = ? AND k IN ")
	args = keyList(b, append(args, mark), calls)
	b.WriteString(";\n")
	return args
}

var (
	heartbeatSQL = stmt(`UPDATE idem_records SET lease_until = :now + :lease, expires_at = GREATEST(expires_at, :now + :lease), updated_at = :now
	WHERE k = :key AND fence = :fence AND state = 1 AND expires_at > :now`)
	settleSQL = stmt(`UPDATE idem_records SET state = :state, result = :result, lease_until = 0, expires_at = :now + :keep, updated_at = :now
	WHERE k = :key AND fence = :fence AND state = 1 AND expires_at > :now`)
	releaseSQL = stmt(`UPDATE idem_records SET state = 5, lease_until = 0, updated_at = :now
	WHERE k = :key AND fence = :fence AND state = 1 AND expires_at > :now`)
	unclaimSQL = stmt(`UPDATE idem_records SET state = 5, lease_until = 0, updated_at = :now, attempts = GREATEST(attempts - 1, 0)
	WHERE k = :key AND fence = :fence AND state = 1 AND expires_at > :now`)
	poisonClaimSQL = stmt(`UPDATE idem_records SET state = 4, lease_until = 0, updated_at = :now, attempts = GREATEST(attempts - 1, 0)
	WHERE k = :key AND fence = :fence AND state = 1 AND expires_at > :now`)
	getSQL = stmt(`SELECT ` + recordCols + ` FROM idem_records WHERE k = :key AND expires_at > :now`)
	// A deleted record stays as an expired row that keeps its fence until
	// a sweep after the millisecond of its Delete (see deleted).
	deleteSQL   = stmt(`UPDATE idem_records SET ` + deleted + ` WHERE k = :key`)
	deleteUpSQL = stmt(`UPDATE idem_records SET ` + deleted + ` WHERE k = :key AND fence <= :fence`)
	// Sweep: the records past their retention (counted), then the rows of
	// deleted records whose millisecond has passed (not counted).
	sweepSQL = stmt(`DELETE FROM idem_records WHERE expires_at < :now AND outcome <> 0 ORDER BY expires_at LIMIT :limit;
SELECT ROW_COUNT();
DELETE FROM idem_records WHERE expires_at < :now AND outcome = 0 AND updated_at < ` + msAtExecution + ` ORDER BY expires_at LIMIT :limit`)
	listSQL  = stmt(`SELECT ` + recordCols + ` FROM idem_records WHERE k > :key AND expires_at > :now ORDER BY k LIMIT :limit`)
	countSQL = stmt(`SELECT state, count(*) FROM idem_records WHERE expires_at > :now GROUP BY state`)
)

// deleted is what Delete and DeleteUpTo set: the record expired at the
// epoch, so no call sees it whatever its clock says, its row kept with its
// fence, from which the key's next claim counts up, until a sweep after
// the millisecond in which the Delete ran (updated_at).
const deleted = `state = 5, result = NULL, lease_until = 0, expires_at = 0, updated_at = ` + msAtExecution + `, outcome = 0`

// fences is shared by every Store of the process, so fences stay strictly
// increasing with an injected clock too; between processes, the server's
// clock (floorAtExecution) keeps them growing.
var fences store.FenceSequence

func (s *Store) nowMs() int64 { return s.clock.Now().UnixMilli() }

// wrap maps driver errors to idem's, keeping the driver's error in the
// chain (errors.As finds *mysql.MySQLError): context errors pass through;
// after Close, ErrClosed; a lost or refused connection, a lock wait
// timeout, a deadlock, a read-only or shutting-down server is
// ErrStoreUnavailable (it may work again); anything else — a missing
// table, a refused value — is returned as it is, for it will not.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if s.closed.Load() || errors.Is(err, sql.ErrConnDone) {
		return fmt.Errorf("%w: mysql %s: %w", store.ErrClosed, op, err)
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && !transient(me.Number) {
		return fmt.Errorf("idem/mysqlstore: %s: %w", op, err)
	}
	return fmt.Errorf("%w: mysql %s: %w", store.ErrUnavailable, op, err)
}

// transient server errors: the same call may succeed later.
func transient(code uint16) bool {
	switch code {
	case 1040, // too many connections
		1053,       // server shutdown in progress
		1205,       // lock wait timeout
		1213,       // deadlock: the transaction was rolled back
		1290,       // read-only (--read-only, a replica)
		1792,       // read-only transaction
		1836,       // read-only mode
		2006, 2013, // gone away, lost connection
		3024, // query execution interrupted, max_statement_time (MySQL)
		1969, // statement time out (MariaDB)
		4031: // disconnected for inactivity
		return true
	}
	return false
}

var errNoRecord = errors.New("idem/mysqlstore: the claimed row was not read back")

// Acquire implements store.Store: one round trip, alone or shared with the
// calls that wait for the store at the same time (Config.NoCoalesce).
func (s *Store) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	if err := s.limits.CheckAcquire(req); err != nil {
		return store.Acquisition{}, err
	}
	return s.write(ctx, writeCall{acquire: true, key: req.Key, fp: req.Fingerprint, lease: req.Lease.Milliseconds(),
		keep: max(req.Retention, req.Lease).Milliseconds(), maxAttempts: req.MaxAttempts})
}

// owned runs a fenced UPDATE: no row matched is ErrStaleFence.
func (s *Store) owned(ctx context.Context, op string, st statement, p *params) error {
	res, err := s.db.ExecContext(ctx, st.text, st.bind(p)...)
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
	return s.owned(ctx, "heartbeat", heartbeatSQL, &params{key: keypack.KeyArg(key), fence: int64(fence), now: s.nowMs(), lease: lease.Milliseconds()})
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
	return s.owned(ctx, "release", releaseSQL, &params{key: keypack.KeyArg(key), fence: int64(fence), now: s.nowMs()})
}

// Unclaim implements store.Unclaimer with one statement.
func (s *Store) Unclaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.owned(ctx, "unclaim", unclaimSQL, &params{key: keypack.KeyArg(key), fence: int64(fence), now: s.nowMs()})
}

// PoisonClaim implements store.Unclaimer with one statement.
func (s *Store) PoisonClaim(ctx context.Context, key string, fence uint64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	return s.owned(ctx, "poison claim", poisonClaimSQL, &params{key: keypack.KeyArg(key), fence: int64(fence), now: s.nowMs()})
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Record{}, err
	}
	rec, err := sqlrecord.Scan(s.db.QueryRowContext(ctx, getSQL.text, getSQL.bind(&params{key: keypack.KeyArg(key), now: s.nowMs()})...))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Record{}, store.ErrNotFound
	}
	return rec, s.wrap("get", err)
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	_, err := s.db.ExecContext(ctx, deleteSQL.text, deleteSQL.bind(&params{key: keypack.KeyArg(key)})...)
	return s.wrap("delete", err)
}

// DeleteUpTo implements store.FencedDeleter.
func (s *Store) DeleteUpTo(ctx context.Context, key string, fence uint64) error {
	_, err := s.db.ExecContext(ctx, deleteUpSQL.text, deleteUpSQL.bind(&params{key: keypack.KeyArg(key), fence: int64(fence)})...)
	return s.wrap("delete", err)
}

// Sweep implements store.Store: up to limit records past their retention
// (all of them when limit <= 0), in one round trip; the rows deleted
// records leave go too, uncounted.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		limit = 1 << 62
	}
	var n int
	err := s.db.QueryRowContext(ctx, sweepSQL.text, sweepSQL.bind(&params{now: s.nowMs(), limit: int64(limit)})...).Scan(&n)
	return n, s.wrap("sweep", err)
}

// List implements store.Lister.
func (s *Store) List(ctx context.Context, after string, limit int) ([]store.Record, error) {
	if limit <= 0 {
		limit = 1 << 62
	}
	rows, err := s.db.QueryContext(ctx, listSQL.text, listSQL.bind(&params{key: keypack.CursorArg(after), now: s.nowMs(), limit: int64(limit)})...)
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
	rows, err := s.db.QueryContext(ctx, countSQL.text, countSQL.bind(&params{now: s.nowMs()})...)
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

// Close closes the database.
func (s *Store) Close() error {
	s.closed.Store(true)
	return s.db.Close()
}

// badConn reports a connection the driver gave up on: what it sent may or
// may not have been applied.
func badConn(err error) bool {
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn)
}

// TableBytes is what idem_records takes on the server: its data and index
// bytes as InnoDB reports them (whole pages), after ANALYZE TABLE brings
// the statistics up to date.
func (s *Store) TableBytes(ctx context.Context) (int64, error) {
	if _, err := s.db.ExecContext(ctx, `ANALYZE TABLE idem_records`); err != nil {
		return 0, s.wrap("size", err)
	}
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT data_length + index_length FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name = 'idem_records'`).Scan(&n)
	return n, s.wrap("size", err)
}

// ServerWarnings reads the server settings idem's promises depend on and
// says what loses records: innodb_flush_log_at_trx_commit other than 1 (a
// crash of the server or of the machine loses about the last second of
// acknowledged claims — a second owner then runs a key beside the first —
// and completions, whose work then runs again), and, where the server
// writes a binary log that replicas or a failover rely on, sync_binlog
// other than 1 (a crash of the machine loses transactions from the log,
// which replicas then lack).
func (s *Store) ServerWarnings(ctx context.Context) ([]string, error) {
	var flush, syncBinlog sql.NullInt64
	var logBin sql.NullString
	if err := s.db.QueryRowContext(ctx, `SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin`).Scan(&flush, &syncBinlog, &logBin); err != nil {
		return nil, s.wrap("read settings", err)
	}
	var warnings []string
	if flush.Int64 != 1 {
		warnings = append(warnings, fmt.Sprintf("innodb_flush_log_at_trx_commit is %d on the server: a crash loses about the last second of acknowledged claims (a second owner then runs a key beside the first) and completions (their work runs again); set it to 1", flush.Int64))
	}
	if on := strings.ToUpper(logBin.String); (on == "1" || on == "ON") && syncBinlog.Int64 != 1 {
		warnings = append(warnings, fmt.Sprintf("sync_binlog is %d on a server that writes a binary log: a crash of the machine loses the last transactions from the log, which replicas and a failover to one then lack (claims run twice, completed work again); set it to 1", syncBinlog.Int64))
	}
	return warnings, nil
}
