// Package sqlmigrate applies numbered schema migrations to PostgreSQL (pgx or
// database/sql) and SQLite, safely from any number of processes at once.
//
// Each component (the idempotency records, the outbox, …) has its own
// numbered migrations; the versions applied are rows of one table,
// idem_migrations, in the component's schema. Apply runs in one transaction
// that first takes the migration lock — pg_advisory_xact_lock on
// PostgreSQL, BEGIN IMMEDIATE on SQLite — so concurrent starters wait for
// the first one and then find nothing left to do. Migration 1 of each
// component is the schema as first released, written with IF NOT EXISTS, so
// a database created before versioning is adopted as version 1.
package sqlmigrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Dialect is the SQL dialect of a database.
type Dialect uint8

// The dialects.
const (
	Postgres Dialect = iota + 1
	SQLite
)

// Step is one migration.
type Step struct {
	Version int    // 1, 2, … in order
	Name    string // what it does, for idem migrate --status
	SQL     string // one or more statements
}

// Applied is a version recorded in idem_migrations.
type Applied struct {
	Component string
	Version   int
	Name      string
	AppliedAt time.Time
}

// Tx is a transaction holding the migration lock.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) error
	Query(ctx context.Context, sql string, args ...any) ([]Applied, error)
}

// Conn runs functions in a transaction under the migration lock.
type Conn interface {
	Dialect() Dialect
	Locked(ctx context.Context, fn func(Tx) error) error
}

// lockKey is the one advisory lock every idem migration takes.
const lockKey = `SELECT pg_advisory_xact_lock(hashtext('idem_migrate'))`

// Pgx is a Conn on a pgx pool (PostgreSQL).
func Pgx(pool *pgxpool.Pool) Conn { return pgxConn{pool} }

type pgxConn struct{ pool *pgxpool.Pool }

func (pgxConn) Dialect() Dialect { return Postgres }

func (c pgxConn) Locked(ctx context.Context, fn func(Tx) error) error {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, lockKey); err != nil {
		return err
	}
	if err := fn(pgxTx{tx}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.Exec(ctx, q, args...)
	return err
}

func (t pgxTx) Query(ctx context.Context, q string, args ...any) ([]Applied, error) {
	rows, err := t.tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanApplied(rows)
}

// SQL is a Conn on a database/sql database of dialect d.
func SQL(db *sql.DB, d Dialect) Conn { return sqlConn{db, d} }

type sqlConn struct {
	db *sql.DB
	d  Dialect
}

func (c sqlConn) Dialect() Dialect { return c.d }

func (c sqlConn) Locked(ctx context.Context, fn func(Tx) error) error {
	conn, err := c.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	begin := "BEGIN"
	if c.d == SQLite {
		begin = "BEGIN IMMEDIATE" // the write lock first: no upgrade deadlock between migrators
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
	if c.d == Postgres {
		if _, err := conn.ExecContext(ctx, lockKey); err != nil {
			return err
		}
	}
	if err := fn(sqlTx{conn}); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return err
	}
	committed = true
	return nil
}

type sqlTx struct{ conn *sql.Conn }

func (t sqlTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.conn.ExecContext(ctx, q, args...)
	return err
}

func (t sqlTx) Query(ctx context.Context, q string, args ...any) ([]Applied, error) {
	rows, err := t.conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanApplied(rows)
}

// ErrNewerSchema: the database has versions this build does not know.
var ErrNewerSchema = errors.New("idem: the database schema is newer than this build")

// Apply brings component in schema ("" for the default) to the last of
// steps and returns the steps it applied. Safe to run from any number of
// processes at once; idempotent.
func Apply(ctx context.Context, c Conn, schema, component string, steps []Step) ([]Step, error) {
	var applied []Step
	err := c.Locked(ctx, func(tx Tx) error {
		applied = nil
		have, err := prepare(ctx, tx, c.Dialect(), schema, component)
		if err != nil {
			return err
		}
		known := map[int]bool{}
		for _, s := range steps {
			known[s.Version] = true
		}
		for v := range have {
			if !known[v] {
				return fmt.Errorf("%w: %s version %d is not one this build knows (it knows 1 to %d)", ErrNewerSchema, component, v, len(steps))
			}
		}
		for _, s := range steps {
			if have[s.Version] {
				continue
			}
			if err := tx.Exec(ctx, s.SQL); err != nil {
				return fmt.Errorf("%s migration %d (%s): %w", component, s.Version, s.Name, err)
			}
			if err := tx.Exec(ctx, `INSERT INTO `+table(schema)+` (component, version, name, applied_at) VALUES ($1, $2, $3, $4)`,
				component, s.Version, s.Name, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
				return fmt.Errorf("%s migration %d: recording it: %w", component, s.Version, err)
			}
			applied = append(applied, s)
		}
		return nil
	})
	return applied, err
}

// Status returns the versions recorded in schema, every component, in order.
func Status(ctx context.Context, c Conn, schema string) ([]Applied, error) {
	var out []Applied
	err := c.Locked(ctx, func(tx Tx) error {
		if _, err := prepare(ctx, tx, c.Dialect(), schema, ""); err != nil {
			return err
		}
		var err error
		out, err = tx.Query(ctx, `SELECT component, version, name, applied_at FROM `+table(schema)+` ORDER BY component, version`)
		return err
	})
	return out, err
}

func table(schema string) string {
	if schema == "" {
		return "idem_migrations"
	}
	return pgx.Identifier{schema, "idem_migrations"}.Sanitize()
}

// prepare creates the schema and the version table if missing and returns
// the versions of component already applied.
func prepare(ctx context.Context, tx Tx, d Dialect, schema, component string) (map[int]bool, error) {
	if schema != "" && d == Postgres {
		if err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
			return nil, err
		}
	}
	if err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table(schema)+` (
	component  text    NOT NULL,
	version    integer NOT NULL,
	name       text    NOT NULL,
	applied_at text    NOT NULL,
	PRIMARY KEY (component, version)
)`); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT component, version, name, applied_at FROM `+table(schema)+` WHERE component = $1`, component)
	if err != nil {
		return nil, err
	}
	have := map[int]bool{}
	for _, r := range rows {
		have[r.Version] = true
	}
	return have, nil
}

// scanApplied reads rows of (component, version, name, applied_at).
func scanApplied(rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}) ([]Applied, error) {
	var out []Applied
	for rows.Next() {
		var a Applied
		var at string
		if err := rows.Scan(&a.Component, &a.Version, &a.Name, &at); err != nil {
			return nil, err
		}
		a.AppliedAt, _ = time.Parse(time.RFC3339Nano, at)
		out = append(out, a)
	}
	return out, rows.Err()
}
