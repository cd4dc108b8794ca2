// Package sqlmigrate applies numbered schema migrations to PostgreSQL (pgx or
// database/sql) and SQLite, safely from any number of processes at once.
//
// Each component (the idempotency records, the outbox, …) has its own
// numbered migrations; the versions applied are rows of one table,
// idem_migrations, in the component's schema. Apply runs in one transaction
// that first takes the migration lock — pg_advisory_xact_lock on
// PostgreSQL, BEGIN IMMEDIATE on SQLite, GET_LOCK on MySQL — so concurrent starters wait for
// the first one and then find nothing left to do. Migration 1 of each
// component creates its tables with IF NOT EXISTS, so tables a user created
// from the component's published schema are adopted as version 1.
package sqlmigrate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemgo/idem/sqldriver"
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

// Conn is what migrations need of a database; every sqldriver.Driver is
// one.
type Conn interface {
	Dialect() sqldriver.Dialect
	Locked(ctx context.Context, fn func(sqldriver.Executor) error) error
}

// ErrNewerSchema: the database has versions this build does not know.
var ErrNewerSchema = errors.New("idem: the database schema is newer than this build")

// Apply brings component in schema ("" for the default) to the last of
// steps and returns the steps it applied. Safe to run from any number of
// processes at once; idempotent.
func Apply(ctx context.Context, c Conn, schema, component string, steps []Step) ([]Step, error) {
	var applied []Step
	err := c.Locked(ctx, func(tx sqldriver.Executor) error {
		applied = nil
		if c.Dialect() == sqldriver.MySQL {
			var version string
			if err := tx.QueryRow(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
				return err
			}
			if err := sqldriver.CheckMySQLServer(version); err != nil {
				return err
			}
		}
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
			if _, err := tx.Exec(ctx, s.SQL); err != nil {
				return fmt.Errorf("%s migration %d (%s): %w", component, s.Version, s.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+table(c.Dialect(), schema)+` (component, version, name, applied_at) VALUES ($1, $2, $3, $4)`,
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
	err := c.Locked(ctx, func(tx sqldriver.Executor) error {
		if _, err := prepare(ctx, tx, c.Dialect(), schema, ""); err != nil {
			return err
		}
		var err error
		out, err = query(ctx, tx, `SELECT component, version, name, applied_at FROM `+table(c.Dialect(), schema)+` ORDER BY component, version`)
		return err
	})
	return out, err
}

func table(d sqldriver.Dialect, schema string) string {
	return sqldriver.QualifyIn(d, schema, "idem_migrations")
}

// versionTable is the DDL of idem_migrations.
func versionTable(d sqldriver.Dialect, schema string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table(d, schema) + ` (
	component  ` + d.KeyText() + ` NOT NULL,
	version    integer NOT NULL,
	name       text    NOT NULL,
	applied_at text    NOT NULL,
	PRIMARY KEY (component, version)
)`
}

// Component is one component's migrations, for Script.
type Component struct {
	Name  string // "records", "outbox", …
	Steps []Step
}

// Script writes, for a database administrator who applies schema changes
// by hand, what Apply would run on an empty database: the schema and the
// version table, then each step in its own transaction with the row that
// records it, so that idem finds the steps applied and runs none of them
// again. A database that already has some versions needs only the steps
// whose (component, version) idem_migrations does not hold.
func Script(d sqldriver.Dialect, schema string, components ...Component) string {
	var b strings.Builder
	now := "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
	switch d {
	case sqldriver.SQLite:
		now = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
	case sqldriver.MySQL:
		now = "DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%dT%H:%i:%s.%fZ')"
	}
	b.WriteString("-- The tables of the version bookkeeping.\nBEGIN;\n")
	if ddl := d.CreateSchema(schema); schema != "" && ddl != "" {
		b.WriteString(ddl + ";\n")
	}
	b.WriteString(versionTable(d, schema) + ";\nCOMMIT;\n")
	for _, c := range components {
		for _, s := range c.Steps {
			fmt.Fprintf(&b, "\n-- %s %d: %s\nBEGIN;\n%s;\n", c.Name, s.Version, s.Name, strings.TrimRight(strings.TrimSpace(s.SQL), ";"))
			fmt.Fprintf(&b, "INSERT INTO %s (component, version, name, applied_at) VALUES (%s, %d, %s, %s);\nCOMMIT;\n",
				table(d, schema), quote(c.Name), s.Version, quote(s.Name), now)
		}
	}
	return b.String()
}

// quote is s as an SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// prepare creates the schema and the version table if missing and returns
// the versions of component already applied.
func prepare(ctx context.Context, tx sqldriver.Executor, d sqldriver.Dialect, schema, component string) (map[int]bool, error) {
	if ddl := d.CreateSchema(schema); schema != "" && ddl != "" {
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return nil, err
		}
	}
	if _, err := tx.Exec(ctx, versionTable(d, schema)); err != nil {
		return nil, err
	}
	rows, err := query(ctx, tx, `SELECT component, version, name, applied_at FROM `+table(d, schema)+` WHERE component = $1`, component)
	if err != nil {
		return nil, err
	}
	have := map[int]bool{}
	for _, r := range rows {
		have[r.Version] = true
	}
	return have, nil
}

// query reads rows of (component, version, name, applied_at).
func query(ctx context.Context, tx sqldriver.Executor, q string, args ...any) ([]Applied, error) {
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
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

// KeyColumns names, for a table as the migrations write it ("schema.table"
// or "table"), the columns that hold keys.
type KeyColumns map[string][]string

// CheckKeyColumns refuses, on MySQL, a table whose key columns do not
// compare byte for byte. The migrations make them binary strings
// (varbinary); a table created by hand with a text type under a
// case-insensitive collation (MySQL's default) holds "ABC" and "abc", or
// "a" and "a ", as one key — a message taken for another's duplicate and
// dropped. A text column with a binary collation (…_bin) passes. On other
// databases text compares byte for byte: nothing to check.
func CheckKeyColumns(ctx context.Context, c Conn, tables KeyColumns) error {
	if c.Dialect() != sqldriver.MySQL {
		return nil
	}
	return c.Locked(ctx, func(tx sqldriver.Executor) error {
		for table, columns := range tables {
			schema, name, ok := strings.Cut(strings.ReplaceAll(table, "`", ""), ".")
			if !ok {
				schema, name = "", schema
			}
			rows, err := tx.Query(ctx, `SELECT column_name, data_type, coalesce(collation_name, '') FROM information_schema.columns
				WHERE table_schema = coalesce(nullif($1, ''), DATABASE()) AND table_name = $2`, schema, name)
			if err != nil {
				return err
			}
			kinds := map[string]string{}
			for rows.Next() {
				var column, typ, collation string
				if err := rows.Scan(&column, &typ, &collation); err != nil {
					rows.Close()
					return err
				}
				kind := strings.ToLower(typ)
				if collation != "" {
					kind += " (collation " + collation + ")"
				}
				if strings.HasSuffix(kind, "binary") || strings.HasSuffix(kind, "blob") || strings.HasSuffix(collation, "_bin") {
					kind = ""
				}
				kinds[strings.ToLower(column)] = kind
			}
			err = rows.Err()
			rows.Close()
			if err != nil {
				return err
			}
			for _, column := range columns {
				kind, ok := kinds[column]
				switch {
				case !ok:
					return fmt.Errorf("%s has no column %s: the table was not created by idem's migration", table, column)
				case kind != "":
					return fmt.Errorf("%s.%s is %s, which does not compare keys byte for byte (keys differing in case or trailing spaces would be one): the table was not created by idem's migration; make the column varbinary, as the migration does", table, column, kind)
				}
			}
		}
		return nil
	})
}
