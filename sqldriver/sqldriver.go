// Package sqldriver is the one seam between idem's SQL components (the
// inbox, the outbox, the idempotency stores' migrations) and a database.
//
// A Driver is implemented once per way of reaching a database —
// [github.com/idemgo/idem/sqldriver/pgxv5] for PostgreSQL through pgx,
// [github.com/idemgo/idem/sqldriver/databasesql] for PostgreSQL, SQLite or
// MySQL through database/sql — and is generic over the transaction type its
// users already hold (pgx.Tx, *sql.Tx), so a component writes into the
// user's own transaction without wrappers or type assertions:
//
//	ob, err := outbox.New(pgxv5.New(pool), outbox.Config{})
//	…
//	err = ob.EnqueueTx(ctx, tx, msg) // tx is the pgx.Tx of the business change
//
// What differs between database families is a Dialect: the few SQL
// fragments in which PostgreSQL and SQLite disagree. Components build their
// statements once from those fragments; no component branches on the
// database. Every driver passes the one suite in
// [github.com/idemgo/idem/sqldriver/drivertest].
package sqldriver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Executor runs statements on a pool, a connection or a transaction.
// Placeholders are $1, $2, … on every dialect.
type Executor interface {
	// Exec runs a statement and returns the number of rows it changed.
	Exec(ctx context.Context, sql string, args ...any) (rowsAffected int64, err error)
	// Query runs a statement returning rows. The caller closes them.
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	// QueryRow runs a statement returning at most one row; Scan reports
	// ErrNoRows (the driver's own) when there is none.
	QueryRow(ctx context.Context, sql string, args ...any) Row
}

// Row is a single-row result.
type Row interface{ Scan(dest ...any) error }

// Rows is a multi-row result.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Driver reaches one database. TTx is the transaction type of the
// driver's users (pgx.Tx, *sql.Tx).
type Driver[TTx any] interface {
	// Dialect is the database family's SQL.
	Dialect() Dialect
	// Executor runs statements on the driver's pool, each in its own
	// implicit transaction.
	Executor() Executor
	// UnwrapExecutor runs statements in the caller's transaction tx.
	UnwrapExecutor(tx TTx) Executor
	// Begin starts a transaction; Commit and Rollback end it. Rollback after
	// Commit is a no-op.
	Begin(ctx context.Context) (TTx, error)
	Commit(ctx context.Context, tx TTx) error
	Rollback(ctx context.Context, tx TTx) error
	// Locked runs fn in a transaction holding the database-wide idem
	// migration lock (an advisory lock on PostgreSQL, the write lock of
	// BEGIN IMMEDIATE on SQLite) and commits it if fn returns nil. Two
	// callers never hold it at once, in any process.
	Locked(ctx context.Context, fn func(ex Executor) error) error
}

// Listener is implemented by drivers that can wake a waiter when another
// session signals a channel (PostgreSQL LISTEN/NOTIFY through pgx).
type Listener interface {
	// Listen subscribes to channel now: a notification sent after it
	// returns nil wakes the next Wait. (Wait subscribes too; a reader that
	// looks for work before its first Wait calls Listen first, so nothing
	// committed in between is missed.)
	Listen(ctx context.Context, channel string) error
	// Wait blocks until channel is notified (true), or until d passes or
	// the connection fails (false: poll).
	Wait(ctx context.Context, channel string, d time.Duration) bool
	// Close releases the listening connection.
	Close()
}

// ClaimBeginner is implemented by drivers that can begin a transaction and
// insert a key row in it in one round trip (pgxv5). A component uses it
// where it would Begin and insert a key first thing — the inbox's Process —
// and falls back to Begin with drivers that lack it.
type ClaimBeginner[TTx any] interface {
	// BeginClaim begins a transaction whose first statement is insert (an
	// INSERT without ON CONFLICT; placeholders $1…$n, every arg a string),
	// sent with BEGIN in one round trip. If the row exists — already
	// committed, or committed meanwhile by a transaction insert waited for —
	// it returns ErrRowExists, with the transaction rolled back. The server
	// logs that unique violation as an error.
	BeginClaim(ctx context.Context, insert string, args ...string) (TTx, error)
}

// ErrRowExists: the row a ClaimBeginner was to insert exists.
var ErrRowExists = errors.New("sqldriver: the row exists")

// Dialect holds the SQL fragments in which database families differ.
// Components write each statement once around them.
type Dialect interface {
	// Now is the current time as a value of a TimeType column.
	Now() string
	// NowPlusMillis is Now plus the number of milliseconds in param (a
	// placeholder such as "$2", or a negated one, "-$2").
	NowPlusMillis(param string) string
	// TimeType is the column type of a point in time; values scan into a
	// time.Time through Time.
	TimeType() string
	// BinaryType is the column type of bytes.
	BinaryType() string
	// SerialKey is the definition of an auto-incremented bigint primary key.
	SerialKey() string
	// SkipLocked ends a SELECT whose rows an UPDATE claims: rows locked by
	// another claimer are skipped ("" where the database locks whole
	// tables).
	SkipLocked() string
	// RowID is the column that addresses a physical row (for DELETE … IN
	// (SELECT … LIMIT n)).
	RowID() string
	// InInt64s is the condition "column is one of ids"; the ids become
	// parameter n (an array) or literals, and args is what to append to the
	// statement's arguments.
	InInt64s(column string, n int, ids []int64) (cond string, args []any)
	// CreateSchema is the statement creating schema if missing ("" where
	// schemas are attached databases, not created by SQL).
	CreateSchema(schema string) string
	// CreateIndex creates index name (unqualified) on table (qualified by
	// schema, "" for none) if missing.
	CreateIndex(schema, name, table, definition string) string
	// NotifyTrigger is the DDL of a trigger that signals channel when rows
	// of table are inserted or their status changes ("" where the
	// database cannot signal; the readers then poll).
	NotifyTrigger(schema, table, channel string) string
	// Durably is the condition of an INSERT … SELECT … WHERE that makes
	// the statement's transaction — its own implicit one, or the one it runs
	// in — commit durably where the session would acknowledge the commit
	// before it is on disk, or before the synchronous standbys the server
	// names have it. PostgreSQL: synchronous_commit raised from off (a
	// crash of the server loses the last acknowledged commits) or local (a
	// failover to a synchronous standby loses them) to on for the
	// transaction (remote_write, on and remote_apply stay; without
	// synchronous standbys on is local), by a function call made only
	// where it is raised — a session that commits synchronously pays one
	// read of the setting, well under a microsecond (measured on
	// PostgreSQL 15: 0.14 µs an evaluation), so the condition can stay in
	// every statement and a setting changed while the program runs is met
	// by the next statement; SQLite: nothing to raise ("true", which its ON
	// CONFLICT needs after a SELECT anyway).
	Durably() string
	// Ident is name quoted as an identifier.
	Ident(name string) string
	// KeyText is the column type of a string in a key or a unique index.
	KeyText() string
	// InSubquery is the condition "column is one of the rows of sel", a
	// SELECT of column that may have a LIMIT, a row lock, and read the
	// table the statement changes.
	InSubquery(column, sel string) string
}

// Qualify returns schema.name with both parts quoted as identifiers of
// PostgreSQL and SQLite, or the quoted name alone when schema is "".
func Qualify(schema, name string) string { return QualifyIn(Postgres, schema, name) }

// QualifyIn returns schema.name with both parts quoted as d's identifiers,
// or the quoted name alone when schema is "".
func QualifyIn(d Dialect, schema, name string) string {
	if schema == "" {
		return d.Ident(name)
	}
	return d.Ident(schema) + "." + d.Ident(name)
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// Time scans a point in time of any dialect into *t: a timestamp
// (PostgreSQL), Unix milliseconds (SQLite), or NULL (the zero time).
func Time(t *time.Time) interface{ Scan(src any) error } { return timeScanner{t} }

type timeScanner struct{ t *time.Time }

func (v timeScanner) Scan(src any) error {
	switch x := src.(type) {
	case nil:
		*v.t = time.Time{}
	case time.Time:
		*v.t = x
	case int64:
		*v.t = time.UnixMilli(x)
	case float64:
		*v.t = time.UnixMilli(int64(x))
	case []byte, string:
		return errors.New("sqldriver: a point in time came as text: open MySQL with parseTime=true&loc=UTC (go-sql-driver/mysql)")
	default:
		return fmt.Errorf("sqldriver: cannot scan a point in time from a %T", src)
	}
	return nil
}
