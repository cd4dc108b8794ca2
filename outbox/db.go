package outbox

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is the part of a transaction (or pool) the outbox writes through;
// PgxTx and SQLTx adapt pgx and database/sql.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (rowsAffected int64, err error)
	QueryRow(ctx context.Context, sql string, args ...any) RowScanner
}

// RowScanner is a single-row result.
type RowScanner interface{ Scan(dest ...any) error }

// rows is a multi-row result.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// conn is what the relay side needs: Tx plus multi-row queries.
type conn interface {
	Tx
	Query(ctx context.Context, sql string, args ...any) (rows, error)
}

type pgxLike interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type pgxQuerier interface {
	pgxLike
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// PgxTx adapts a pgx.Tx, *pgxpool.Pool or *pgx.Conn.
func PgxTx(tx pgxLike) Tx { return pgxAdapter{tx} }

type pgxAdapter struct{ tx pgxLike }

func (a pgxAdapter) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := a.tx.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (a pgxAdapter) QueryRow(ctx context.Context, q string, args ...any) RowScanner {
	return a.tx.QueryRow(ctx, q, args...)
}

func (a pgxAdapter) Query(ctx context.Context, q string, args ...any) (rows, error) {
	return a.tx.(pgxQuerier).Query(ctx, q, args...)
}

type sqlLike interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type sqlQuerier interface {
	sqlLike
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// SQLTx adapts a *sql.Tx, *sql.DB or *sql.Conn.
func SQLTx(tx sqlLike) Tx { return sqlAdapter{tx} }

type sqlAdapter struct{ tx sqlLike }

func (a sqlAdapter) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := a.tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (a sqlAdapter) QueryRow(ctx context.Context, q string, args ...any) RowScanner {
	return a.tx.QueryRowContext(ctx, q, args...)
}

func (a sqlAdapter) Query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := a.tx.(sqlQuerier).QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// timeValue scans a timestamp of either dialect: timestamptz (pgx, or
// database/sql with the pgx driver) or Unix milliseconds (SQLite).
type timeValue struct{ t *time.Time }

func (v timeValue) Scan(src any) error {
	switch x := src.(type) {
	case nil:
		*v.t = time.Time{}
	case time.Time:
		*v.t = x
	case int64:
		*v.t = time.UnixMilli(x)
	}
	return nil
}
