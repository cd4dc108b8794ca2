package sqldriver

import (
	"fmt"
	"strconv"
	"strings"
)

// Postgres is the dialect of PostgreSQL (and of databases that speak it).
var Postgres Dialect = postgres{}

// SQLite is the dialect of SQLite (modernc.org/sqlite). Points in time are
// Unix milliseconds in INTEGER columns.
var SQLite Dialect = sqlite{}

// MySQL is the dialect of MySQL 8.0 and later and of MariaDB 10.6 and
// later (github.com/go-sql-driver/mysql), on InnoDB. Points in time are
// UTC in datetime(6) columns: open the database with parseTime=true and
// loc=UTC. A schema is a database of the server. Identifiers are quoted
// with backticks, so the server's sql_mode may be anything.
var MySQL Dialect = mysql{}

type postgres struct{}

func (postgres) Now() string        { return "now()" }
func (postgres) TimeType() string   { return "timestamptz" }
func (postgres) BinaryType() string { return "bytea" }
func (postgres) SerialKey() string  { return "bigserial PRIMARY KEY" }
func (postgres) SkipLocked() string { return " FOR UPDATE SKIP LOCKED" }
func (postgres) RowID() string      { return "ctid" }

func (postgres) NowPlusMillis(param string) string {
	return "(now() + " + param + "::float8 * interval '1 millisecond')"
}

func (postgres) InInt64s(column string, n int, ids []int64) (string, []any) {
	return column + " = ANY($" + strconv.Itoa(n) + ")", []any{ids}
}

func (postgres) CreateSchema(schema string) string {
	return "CREATE SCHEMA IF NOT EXISTS " + quote(schema)
}

// CreateIndex: a PostgreSQL index lives in its table's schema and is named
// without it.
func (postgres) CreateIndex(schema, name, table, definition string) string {
	return "CREATE INDEX IF NOT EXISTS " + name + " ON " + dotted(schema, table) + " " + definition
}

func (postgres) NotifyTrigger(schema, table, channel string) string {
	fn := dotted(schema, table+"_notify")
	return `CREATE OR REPLACE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_notify('` + channel + `', ''); RETURN NULL; END $$;
DROP TRIGGER IF EXISTS ` + table + `_notify ON ` + dotted(schema, table) + `;
CREATE TRIGGER ` + table + `_notify AFTER INSERT OR UPDATE OF status ON ` + dotted(schema, table) + `
	FOR EACH STATEMENT EXECUTE FUNCTION ` + fn + `();`
}

func (postgres) Ident(name string) string { return quote(name) }

func (postgres) InSubquery(column, sel string) string { return column + " IN (" + sel + ")" }
func (postgres) KeyText() string                      { return "text" }

func (postgres) Durably() string {
	return `(current_setting('synchronous_commit') NOT IN ('off', 'local') OR set_config('synchronous_commit', 'on', true) IS NOT NULL)`
}

type sqlite struct{}

func (sqlite) Now() string        { return "CAST(unixepoch('subsec') * 1000 AS INTEGER)" }
func (sqlite) TimeType() string   { return "INTEGER" }
func (sqlite) BinaryType() string { return "BLOB" }
func (sqlite) SerialKey() string  { return "INTEGER PRIMARY KEY" }
func (sqlite) SkipLocked() string { return "" }
func (sqlite) RowID() string      { return "rowid" }

func (d sqlite) NowPlusMillis(param string) string { return "(" + d.Now() + " + " + param + ")" }

func (sqlite) InInt64s(column string, _ int, ids []int64) (string, []any) {
	var b strings.Builder
	b.WriteString(column + " IN (")
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	b.WriteByte(')')
	return b.String(), nil
}

func (sqlite) CreateSchema(string) string { return "" }

// CreateIndex: an SQLite index is named in its table's (attached) database
// and names the table without it.
func (sqlite) CreateIndex(schema, name, table, definition string) string {
	return "CREATE INDEX IF NOT EXISTS " + dotted(schema, name) + " ON " + table + " " + definition
}

func (sqlite) NotifyTrigger(string, string, string) string { return "" }

func (sqlite) Durably() string { return "true" }

func (sqlite) Ident(name string) string { return quote(name) }

func (sqlite) InSubquery(column, sel string) string { return column + " IN (" + sel + ")" }
func (sqlite) KeyText() string                      { return "text" }

type mysql struct{}

func (mysql) Now() string        { return "UTC_TIMESTAMP(6)" }
func (mysql) TimeType() string   { return "datetime(6)" }
func (mysql) BinaryType() string { return "longblob" }
func (mysql) SerialKey() string  { return "bigint AUTO_INCREMENT PRIMARY KEY" }
func (mysql) SkipLocked() string { return " FOR UPDATE SKIP LOCKED" }

// RowID: MySQL has no physical row address; idem's tables of this dialect
// address rows by their id.
func (mysql) RowID() string { return "id" }

// InSubquery: MySQL reads neither a LIMIT in an IN subquery nor a subquery
// of the table a statement updates; a derived table around it is read as
// both.
func (mysql) InSubquery(column, sel string) string {
	return column + " IN (SELECT " + column + " FROM (" + sel + ") AS idem_sub)"
}

func (mysql) NowPlusMillis(param string) string {
	return "TIMESTAMPADD(MICROSECOND, (" + param + ") * 1000, UTC_TIMESTAMP(6))"
}

func (mysql) InInt64s(column string, n int, ids []int64) (string, []any) {
	return sqlite{}.InInt64s(column, n, ids)
}

func (d mysql) CreateSchema(schema string) string {
	return "CREATE DATABASE IF NOT EXISTS " + d.Ident(schema) + " CHARACTER SET utf8mb4"
}

// CreateIndex: InnoDB has no partial indexes, so a definition's WHERE
// clause is dropped (the index covers every row). IF NOT EXISTS is
// MariaDB's; on MySQL 8 the statement fails on an existing index (the
// migrations run it once).
func (d mysql) CreateIndex(schema, name, table, definition string) string {
	if i := strings.Index(definition, " WHERE "); i >= 0 {
		definition = definition[:i]
	}
	tbl := d.Ident(table)
	if schema != "" {
		tbl = d.Ident(schema) + "." + tbl
	}
	return "CREATE INDEX IF NOT EXISTS " + d.Ident(name) + " ON " + tbl + " " + definition
}

func (mysql) NotifyTrigger(string, string, string) string { return "" }

// Durably: InnoDB's durability is the server's (innodb_flush_log_at_trx_commit,
// sync_binlog), not a session's to lower: nothing to raise.
func (mysql) Durably() string { return "TRUE" }

func (mysql) Ident(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// KeyText: InnoDB indexes a bounded string only; 255 characters of
// utf8mb4 are 1,020 bytes, within its 3,072-byte key prefix.
func (mysql) KeyText() string { return "varchar(255)" }

// CheckMySQLServer refuses a server older than MySQL 8.0 or MariaDB 10.6
// (the first with FOR UPDATE SKIP LOCKED), saying which it is; version is
// what VERSION() returns ("8.0.36", "10.11.19-MariaDB-0+deb12u1").
func CheckMySQLServer(version string) error {
	var major, minor int
	_, err := fmt.Sscanf(version, "%d.%d", &major, &minor)
	ok := err == nil && major >= 8
	if strings.Contains(strings.ToLower(version), "mariadb") {
		ok = err == nil && (major > 10 || major == 10 && minor >= 6)
	}
	if !ok {
		return fmt.Errorf("the server is %s; idem needs MySQL 8.0 or later, or MariaDB 10.6 or later (the first with SKIP LOCKED)", version)
	}
	return nil
}

// dotted is schema.name, or name alone.
func dotted(schema, name string) string {
	if schema == "" {
		return name
	}
	return schema + "." + name
}
