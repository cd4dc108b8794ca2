package sqldriver

import (
	"strconv"
	"strings"
)

// Postgres is the dialect of PostgreSQL (and of databases that speak it).
var Postgres Dialect = postgres{}

// SQLite is the dialect of SQLite (modernc.org/sqlite). Points in time are
// Unix milliseconds in INTEGER columns.
var SQLite Dialect = sqlite{}

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

// dotted is schema.name, or name alone.
func dotted(schema, name string) string {
	if schema == "" {
		return name
	}
	return schema + "." + name
}
