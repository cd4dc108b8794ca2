// Package databasesql is the sqldriver.Driver of a database/sql database:
// PostgreSQL (with the pgx stdlib driver, or any other), SQLite
// (modernc.org/sqlite) or MySQL and MariaDB (github.com/go-sql-driver/mysql).
// Its users hold *sql.Tx transactions. It cannot listen for notifications:
// readers poll.
package databasesql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemgo/idem/sqldriver"
)

// Driver reaches a database/sql database of one dialect.
type Driver struct {
	db *sql.DB
	d  sqldriver.Dialect
}

// New returns the driver of db, whose SQL is dialect (sqldriver.Postgres,
// sqldriver.SQLite or sqldriver.MySQL). The DB stays the caller's to close.
//
// For MySQL, open the database with parseTime=true and loc=UTC (points in
// time are UTC datetime(6) values). Statements keep the $1, $2, …
// placeholders of every dialect; the driver sends them as MySQL's ?, the
// arguments repeated and reordered to match, and runs a migration's
// several statements one by one.
//
// For SQLite, open the database with _txlock=immediate (so a transaction
// that will write takes the write lock when it begins, not on its first
// write, where two writers would deadlock) and a busy timeout, e.g.
// "file:app.db?_txlock=immediate&_pragma=busy_timeout(5000)".
func New(db *sql.DB, dialect sqldriver.Dialect) *Driver { return &Driver{db: db, d: dialect} }

var _ sqldriver.Driver[*sql.Tx] = (*Driver)(nil)

// Dialect is the dialect given to New.
func (d *Driver) Dialect() sqldriver.Dialect { return d.d }

// Executor runs on the DB.
func (d *Driver) Executor() sqldriver.Executor { return d.executor(d.db) }

// UnwrapExecutor runs in tx.
func (d *Driver) UnwrapExecutor(tx *sql.Tx) sqldriver.Executor { return d.executor(tx) }

func (d *Driver) executor(q querier) sqldriver.Executor {
	if d.d == sqldriver.MySQL {
		return mysqlExecutor{executor{q}}
	}
	return executor{q}
}

// Begin starts a transaction.
func (d *Driver) Begin(ctx context.Context) (*sql.Tx, error) { return d.db.BeginTx(ctx, nil) }

// Commit commits tx.
func (*Driver) Commit(_ context.Context, tx *sql.Tx) error { return tx.Commit() }

// Rollback rolls tx back; after Commit it is a no-op.
func (*Driver) Rollback(_ context.Context, tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// Locked runs fn in a transaction holding the migration lock: on
// PostgreSQL idem's advisory lock; on SQLite the database's write lock,
// taken at BEGIN IMMEDIATE (so two migrators never deadlock upgrading a
// read lock); on MySQL the named lock idem_migrate (GET_LOCK), held by the
// session and released on every path. MySQL commits each DDL statement on
// its own, so there fn's schema changes are not undone when it fails:
// migrations of that dialect are written to be run again.
func (d *Driver) Locked(ctx context.Context, fn func(sqldriver.Executor) error) error {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	begin, lock := "BEGIN", "SELECT pg_advisory_xact_lock(hashtext('idem_migrate'))"
	switch d.d {
	case sqldriver.SQLite:
		begin, lock = "BEGIN IMMEDIATE", ""
	case sqldriver.MySQL: // a named lock of the session, taken before the transaction
		lock = ""
		if err := getLock(ctx, conn); err != nil {
			return err
		}
		defer func() {
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK('idem_migrate')")
		}()
	}
	if _, err := conn.ExecContext(ctx, begin); err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	if lock != "" {
		if _, err := conn.ExecContext(ctx, lock); err != nil {
			return err
		}
	}
	if err := fn(d.executor(conn)); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return err
	}
	committed = true
	return nil
}

// getLock takes MySQL's named lock idem_migrate for conn's session,
// waiting as long as ctx allows.
func getLock(ctx context.Context, conn *sql.Conn) error {
	for {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK('idem_migrate', 1)").Scan(&got); err != nil {
			return err
		}
		if got.Valid && got.Int64 == 1 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// querier is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type executor struct{ q querier }

func (e executor) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e executor) Query(ctx context.Context, query string, args ...any) (sqldriver.Rows, error) {
	rows, err := e.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

func (e executor) QueryRow(ctx context.Context, query string, args ...any) sqldriver.Row {
	return e.q.QueryRowContext(ctx, query, args...)
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }
