package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Dialect selects the SQL of a database.
type Dialect uint8

// The supported databases.
const (
	Postgres Dialect = 1
	SQLite   Dialect = 2
)

// Outcome is what processing a message did.
type Outcome uint8

// The outcomes of Process.
const (
	// Processed: the business change and the key committed together.
	Processed Outcome = 1
	// Duplicate: the key was there already; nothing changed. Acknowledge.
	Duplicate Outcome = 2
	// Stale: the version guard found a newer version applied; the key is
	// recorded, nothing else changed. Acknowledge.
	Stale Outcome = 3
)

func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	}
	return "outcome(?)"
}

// Event identifies one message to the inbox.
type Event struct {
	// Consumer names the consumer (its durable name); the same correlation
	// id processed by two consumers is two rows.
	Consumer string
	// CorrelationID is the producer's id of the business intent. Required.
	CorrelationID string
	// Type is the event type, for operators. Optional.
	Type string
	// Entity and Version, when Entity is set, run the version guard in the
	// same transaction: the message applies only if Version is newer than
	// the entity's last applied version.
	Entity  string
	Version int64
}

func (e Event) validate() error {
	if e.Consumer == "" || e.CorrelationID == "" {
		return errors.New("idem/inbox: Event.Consumer and Event.CorrelationID are required")
	}
	if len(e.Consumer) > 255 || len(e.CorrelationID) > 255 || len(e.Type) > 255 || len(e.Entity) > 255 {
		return errors.New("idem/inbox: Event fields are limited to 255 bytes")
	}
	return nil
}

// Config configures an Inbox.
type Config struct {
	// Dialect of the database. Required.
	Dialect Dialect
	// Table holds the processed keys. Defaults to "processed_events"; it may
	// be schema-qualified ("billing.processed_events").
	Table string
	// VersionTable holds the version guard's last applied versions.
	// Defaults to "entity_versions".
	VersionTable string
	// ConsumerVersion is recorded on every row (the deployed build), for
	// operators. Optional.
	ConsumerVersion string
}

// Inbox records processed keys in the caller's transactions.
type Inbox struct {
	cfg Config
	sql struct{ claim, version, sweep string }
}

var ident = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// New validates cfg and returns an Inbox.
func New(cfg Config) (*Inbox, error) {
	if cfg.Dialect != Postgres && cfg.Dialect != SQLite {
		return nil, errors.New("idem/inbox: Config.Dialect must be Postgres or SQLite")
	}
	if cfg.Table == "" {
		cfg.Table = "processed_events"
	}
	if cfg.VersionTable == "" {
		cfg.VersionTable = "entity_versions"
	}
	for name, v := range map[string]string{"Table": cfg.Table, "VersionTable": cfg.VersionTable} {
		if !ident.MatchString(v) {
			return nil, fmt.Errorf("idem/inbox: Config.%s %q is not a plain [schema.]name", name, v)
		}
	}
	i := &Inbox{cfg: cfg}
	now := "now()"
	if cfg.Dialect == SQLite {
		now = "(unixepoch('subsec') * 1000)"
	}
	i.sql.claim = `INSERT INTO ` + cfg.Table + ` (consumer, correlation_id, event_type, processed_at, consumer_version)
VALUES ($1, $2, $3, ` + now + `, $4) ON CONFLICT (consumer, correlation_id) DO NOTHING`
	i.sql.version = `INSERT INTO ` + cfg.VersionTable + ` AS v (entity, version, updated_at) VALUES ($1, $2, ` + now + `)
ON CONFLICT (entity) DO UPDATE SET version = EXCLUDED.version, updated_at = EXCLUDED.updated_at
WHERE v.version < EXCLUDED.version`
	if cfg.Dialect == Postgres {
		i.sql.sweep = `DELETE FROM ` + cfg.Table + ` WHERE ctid IN (SELECT ctid FROM ` + cfg.Table + `
WHERE processed_at < now() - $1::float8 * interval '1 millisecond' LIMIT $2)`
	} else {
		i.sql.sweep = `DELETE FROM ` + cfg.Table + ` WHERE rowid IN (SELECT rowid FROM ` + cfg.Table + `
WHERE processed_at < (unixepoch('subsec') * 1000) - $1 LIMIT $2)`
	}
	return i, nil
}

// Schema returns the DDL of the inbox and version tables, for migrations run
// by other tools. Migrate runs it.
func (i *Inbox) Schema() string {
	ts := "timestamptz NOT NULL"
	if i.cfg.Dialect == SQLite {
		ts = "INTEGER NOT NULL /* Unix ms */"
	}
	return `CREATE TABLE IF NOT EXISTS ` + i.cfg.Table + ` (
	consumer         text NOT NULL,
	correlation_id   text NOT NULL,
	event_type       text NOT NULL DEFAULT '',
	processed_at     ` + ts + `,
	consumer_version text NOT NULL DEFAULT '',
	PRIMARY KEY (consumer, correlation_id)
);
CREATE INDEX IF NOT EXISTS ` + i.indexName() + ` ON ` + i.cfg.Table + ` (processed_at);
CREATE TABLE IF NOT EXISTS ` + i.cfg.VersionTable + ` (
	entity     text PRIMARY KEY,
	version    bigint NOT NULL,
	updated_at ` + ts + `
);`
}

// indexName is the table's name plus _processed_at: bare on PostgreSQL (an
// index lives in its table's schema), schema-qualified on SQLite.
func (i *Inbox) indexName() string {
	schema, name, ok := strings.Cut(i.cfg.Table, ".")
	if !ok {
		return i.cfg.Table + "_processed_at"
	}
	if i.cfg.Dialect == SQLite {
		return schema + "." + name + "_processed_at"
	}
	return name + "_processed_at"
}

// Tx is the part of a transaction the inbox needs; PgxTx and SQLTx adapt
// pgx.Tx and *sql.Tx (and *sql.DB, *pgxpool.Pool outside a transaction).
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (rowsAffected int64, err error)
}

// PgxTx adapts a pgx transaction (or pool, or connection).
func PgxTx(tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}) Tx {
	return pgxAdapter{tx}
}

type pgxAdapter struct {
	tx interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	}
}

func (a pgxAdapter) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := a.tx.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

// SQLTx adapts a database/sql transaction (or *sql.DB, *sql.Conn).
func SQLTx(tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}) Tx {
	return sqlAdapter{tx}
}

type sqlAdapter struct {
	tx interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	}
}

func (a sqlAdapter) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := a.tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// ClaimTx inserts ev's key in tx. It returns Processed when the key is new
// (go on with the business change in tx, then commit), Duplicate when it was
// there already (roll back and acknowledge), or Stale when ev carries a
// version that is not newer than the entity's (commit: the key is recorded,
// make no other change). On a concurrent duplicate in another transaction,
// ClaimTx waits for it: Duplicate if it commits, Processed if it rolls back.
func (i *Inbox) ClaimTx(ctx context.Context, tx Tx, ev Event) (Outcome, error) {
	if err := ev.validate(); err != nil {
		return 0, err
	}
	n, err := tx.Exec(ctx, i.sql.claim, ev.Consumer, ev.CorrelationID, ev.Type, i.cfg.ConsumerVersion)
	if err != nil {
		return 0, fmt.Errorf("idem/inbox: claim %s/%s: %w", ev.Consumer, ev.CorrelationID, err)
	}
	if n == 0 {
		return Duplicate, nil
	}
	if ev.Entity == "" {
		return Processed, nil
	}
	fresh, err := i.ApplyVersionTx(ctx, tx, ev.Entity, ev.Version)
	if err != nil {
		return 0, err
	}
	if !fresh {
		return Stale, nil
	}
	return Processed, nil
}

// ApplyVersionTx is the version guard, one atomic statement: it records
// version for entity and returns true if it is newer than the last applied
// one, or false (stale: nothing changed) otherwise. Call it in the
// transaction of the update it guards, or on a pool/DB as a standalone
// operation.
func (i *Inbox) ApplyVersionTx(ctx context.Context, tx Tx, entity string, version int64) (bool, error) {
	if entity == "" || len(entity) > 255 {
		return false, errors.New("idem/inbox: the entity must be 1 to 255 bytes")
	}
	n, err := tx.Exec(ctx, i.sql.version, entity, version)
	if err != nil {
		return false, fmt.Errorf("idem/inbox: version guard %s@%d: %w", entity, version, err)
	}
	return n == 1, nil
}

// Migrate creates the tables (idempotent).
func (i *Inbox) Migrate(ctx context.Context, db Tx) error {
	if _, err := db.Exec(ctx, i.Schema()); err != nil {
		return fmt.Errorf("idem/inbox: migrate: %w", err)
	}
	return nil
}

// Sweep deletes up to limit keys processed more than olderThan ago and
// returns how many. Run it in a loop (idem.Sweeper style) to bound the table;
// a duplicate that arrives after its key was swept runs again, so keep keys
// longer than the broker can redeliver.
func (i *Inbox) Sweep(ctx context.Context, db Tx, olderThan time.Duration, limit int) (int, error) {
	if limit <= 0 {
		limit = 1000
	}
	n, err := db.Exec(ctx, i.sql.sweep, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("idem/inbox: sweep: %w", err)
	}
	return int(n), nil
}

// ProcessPgx runs fn and records ev in one pgx transaction begun on db. fn
// runs only for a new key; a Duplicate or Stale event commits nothing of
// fn's. If fn fails, everything rolls back and the redelivery runs it again.
func (i *Inbox) ProcessPgx(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, ev Event, fn func(ctx context.Context, tx pgx.Tx) error) (Outcome, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("idem/inbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	out, err := i.ClaimTx(ctx, PgxTx(tx), ev)
	if err != nil || out == Duplicate {
		return out, err
	}
	if out == Processed {
		if err := fn(ctx, tx); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("idem/inbox: commit: %w", err)
	}
	return out, nil
}

// ProcessSQL is ProcessPgx for database/sql.
func (i *Inbox) ProcessSQL(ctx context.Context, db *sql.DB, ev Event, fn func(ctx context.Context, tx *sql.Tx) error) (Outcome, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("idem/inbox: begin: %w", err)
	}
	defer tx.Rollback()
	out, err := i.ClaimTx(ctx, SQLTx(tx), ev)
	if err != nil || out == Duplicate {
		return out, err
	}
	if out == Processed {
		if err := fn(ctx, tx); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("idem/inbox: commit: %w", err)
	}
	return out, nil
}
