package inbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem/internal/sqlmigrate"
	"github.com/idemgo/idem/sqldriver"
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
	// Table holds the processed keys. Defaults to "processed_events"; it may
	// be schema-qualified ("billing.processed_events").
	Table string
	// VersionTable holds the version guard's last applied versions.
	// Defaults to "entity_versions".
	VersionTable string
	// ConsumerVersion is recorded on every row (the deployed build), for
	// operators. Optional.
	ConsumerVersion string
	// ClaimSeparately makes Process send its claim as a statement of its
	// own after BEGIN. By default, on a driver that can (pgxv5, a
	// sqldriver.ClaimBeginner), Process sends BEGIN and the claim in one
	// round trip, and a duplicate is the claim's unique violation — which
	// the server logs as an error. Set it to keep duplicates out of the
	// server's log at one round trip more per message.
	ClaimSeparately bool
	// TracerProvider, if set, traces Process: a span "idem.inbox.process"
	// (the consumer, the outcome), the business change's spans its
	// children.
	TracerProvider trace.TracerProvider
}

// Inbox records processed keys in the caller's transactions, of type TTx
// (pgx.Tx, *sql.Tx).
type Inbox[TTx any] struct {
	cfg    Config
	driver sqldriver.Driver[TTx]
	schema string // of Table, "" for none
	sql    struct {
		claim, claimStrict, claimMany, claimManyEnd string
		unclaim, version, sweep, list, find         string
		versionInsert                               string // MySQL: see applyVersion
	}
	mysql bool
}

var ident = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// New validates cfg and returns the inbox of the database reached by driver
// (pgxv5.New(pool), databasesql.New(db, sqldriver.SQLite), …).
func New[TTx any](driver sqldriver.Driver[TTx], cfg Config) (*Inbox[TTx], error) {
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
	i := &Inbox[TTx]{cfg: cfg, driver: driver}
	if schema, _, ok := strings.Cut(cfg.Table, "."); ok {
		i.schema = schema
	}
	d := driver.Dialect()
	// The claims carry the condition that makes the transaction recording
	// the key commit durably (Dialect.Durably), whoever began it and
	// whatever the session's setting is when it runs (it may be turned off
	// while the program runs): a consumer acknowledges the message once it
	// commits, and its broker forgets it.
	durably := d.Durably()
	insert := `INSERT INTO ` + cfg.Table + ` (consumer, correlation_id, event_type, processed_at, consumer_version) `
	row := `$1, $2, $3, ` + d.Now() + `, $4`
	const onConflict = ` ON CONFLICT (consumer, correlation_id) DO NOTHING`
	i.sql.claim = insert + `SELECT ` + row + ` WHERE ` + durably + onConflict
	i.sql.claimStrict = insert + `SELECT ` + row + ` WHERE ` + durably
	i.sql.claimMany = insert + `SELECT v.* FROM (VALUES `
	i.sql.claimManyEnd = `) AS v WHERE ` + durably + onConflict + ` RETURNING consumer, correlation_id`
	i.sql.unclaim = `DELETE FROM ` + cfg.Table + ` WHERE consumer = $1 AND correlation_id = $2`
	i.sql.version = `INSERT INTO ` + cfg.VersionTable + ` AS v (entity, version, updated_at) VALUES ($1, $2, ` + d.Now() + `)
ON CONFLICT (entity) DO UPDATE SET version = EXCLUDED.version, updated_at = EXCLUDED.updated_at
WHERE v.version < EXCLUDED.version`
	i.sql.list = `SELECT consumer, correlation_id, event_type, processed_at, consumer_version FROM ` + cfg.Table + `
WHERE ($1 = '' OR consumer = $1) AND (consumer > $2 OR (consumer = $2 AND correlation_id > $3))
ORDER BY consumer, correlation_id LIMIT $4`
	i.sql.find = `SELECT consumer, correlation_id, event_type, processed_at, consumer_version FROM ` + cfg.Table + `
WHERE correlation_id = $1 ORDER BY consumer LIMIT 100`
	i.sql.sweep = `DELETE FROM ` + cfg.Table + ` WHERE ` + d.RowID() + ` IN (SELECT ` + d.RowID() + ` FROM ` + cfg.Table + `
WHERE processed_at < ` + d.NowPlusMillis("-$1") + ` LIMIT $2)`
	if d == sqldriver.MySQL {
		if len(cfg.ConsumerVersion) > 255 {
			return nil, errors.New("idem/inbox: Config.ConsumerVersion is limited to 255 bytes on MySQL")
		}
		i.mysql = true
		i.mysqlStatements(d)
	}
	return i, nil
}

// mysqlStatements replaces the statements MySQL and MariaDB do not take
// (ON CONFLICT, RETURNING, a LIMIT in a subquery). A claim is INSERT IGNORE:
// a duplicate waits for the transaction that inserted the key, as on
// PostgreSQL, and is then ignored (no row affected), whatever the
// connection's CLIENT_FOUND_ROWS; the event's fields are bounded before
// (validate), so IGNORE turns no other error into a warning. The version
// guard raises an existing row first (one statement, an exclusive lock at
// once) and inserts a new entity's row only when there was none (see
// applyVersion). A batch claims its keys one statement each (MySQL 8 has no
// RETURNING to tell which rows a multi-row insert added).
func (i *Inbox[TTx]) mysqlStatements(d sqldriver.Dialect) {
	i.sql.claim = `INSERT IGNORE INTO ` + i.cfg.Table + ` (consumer, correlation_id, event_type, processed_at, consumer_version) VALUES ($1, $2, $3, ` + d.Now() + `, $4)`
	i.sql.claimStrict = `INSERT INTO ` + i.cfg.Table + ` (consumer, correlation_id, event_type, processed_at, consumer_version) VALUES ($1, $2, $3, ` + d.Now() + `, $4)`
	i.sql.claimMany, i.sql.claimManyEnd = "", ""
	i.sql.version = `UPDATE ` + i.cfg.VersionTable + ` SET version = $2, updated_at = ` + d.Now() + ` WHERE entity = $1 AND version < $2`
	i.sql.versionInsert = `INSERT IGNORE INTO ` + i.cfg.VersionTable + ` (entity, version, updated_at) VALUES ($1, $2, ` + d.Now() + `)`
	i.sql.sweep = `DELETE FROM ` + i.cfg.Table + ` WHERE processed_at < ` + d.NowPlusMillis("-$1") + ` LIMIT $2`
}

// Schema returns the DDL of the inbox and version tables, for migrations run
// by other tools. Migrate runs it.
func (i *Inbox[TTx]) Schema() string {
	d := i.driver.Dialect()
	ts := d.TimeType() + " NOT NULL"
	table := i.cfg.Table
	if i.schema != "" {
		table = strings.TrimPrefix(table, i.schema+".")
	}
	if i.mysql {
		// Keys compared byte for byte (a binary string: no collation folds
		// case or trailing spaces), within InnoDB's key length.
		return `CREATE TABLE IF NOT EXISTS ` + i.cfg.Table + ` (
	consumer         varbinary(255) NOT NULL,
	correlation_id   varbinary(255) NOT NULL,
	event_type       varbinary(255) NOT NULL DEFAULT '',
	processed_at     ` + ts + `,
	consumer_version varbinary(255) NOT NULL DEFAULT '',
	PRIMARY KEY (consumer, correlation_id),
	KEY ` + d.Ident(table+"_processed_at") + ` (processed_at)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS ` + i.cfg.VersionTable + ` (
	entity     varbinary(255) NOT NULL PRIMARY KEY,
	version    bigint NOT NULL,
	updated_at ` + ts + `
) ENGINE=InnoDB;`
	}
	return `CREATE TABLE IF NOT EXISTS ` + i.cfg.Table + ` (
	consumer         text NOT NULL,
	correlation_id   text NOT NULL,
	event_type       text NOT NULL DEFAULT '',
	processed_at     ` + ts + `,
	consumer_version text NOT NULL DEFAULT '',
	PRIMARY KEY (consumer, correlation_id)
);
` + d.CreateIndex(i.schema, table+"_processed_at", table, "(processed_at)") + `;
CREATE TABLE IF NOT EXISTS ` + i.cfg.VersionTable + ` (
	entity     text PRIMARY KEY,
	version    bigint NOT NULL,
	updated_at ` + ts + `
);`
}

// Migrations returns the inbox's numbered migrations. Version 1 creates the
// tables (Schema, written with IF NOT EXISTS: tables created from it by
// hand are adopted as they are).
func (i *Inbox[TTx]) Migrations() []sqlmigrate.Step {
	return []sqlmigrate.Step{{Version: 1, Name: "processed events and entity versions", SQL: i.Schema()}}
}

// component names the inbox's migrations: one per table, so two inboxes in
// one database migrate independently.
func (i *Inbox[TTx]) component() string { return "inbox:" + i.cfg.Table }

// Migrate creates or upgrades the inbox's tables: the missing numbered
// migrations, in one transaction under the migration lock, recorded in
// idem_migrations (in the table's schema). Any number of processes may run
// it at once.
func (i *Inbox[TTx]) Migrate(ctx context.Context) error {
	if _, err := sqlmigrate.Apply(ctx, i.driver, i.schema, i.component(), i.Migrations()); err != nil {
		return fmt.Errorf("idem/inbox: migrate: %w", err)
	}
	keys := sqlmigrate.KeyColumns{i.cfg.Table: {"consumer", "correlation_id"}, i.cfg.VersionTable: {"entity"}}
	if err := sqlmigrate.CheckKeyColumns(ctx, i.driver, keys); err != nil {
		return fmt.Errorf("idem/inbox: migrate: %w", err)
	}
	return nil
}

// ClaimTx inserts ev's key in tx. It returns Processed when the key is new
// (go on with the business change in tx, then commit), Duplicate when it was
// there already (roll back and acknowledge), or Stale when ev carries a
// version that is not newer than the entity's (commit: the key is recorded,
// make no other change). On a concurrent duplicate in another transaction,
// ClaimTx waits for it: Duplicate if it commits, Processed if it rolls back.
func (i *Inbox[TTx]) ClaimTx(ctx context.Context, tx TTx, ev Event) (Outcome, error) {
	return i.claim(ctx, i.driver.UnwrapExecutor(tx), ev)
}

func (i *Inbox[TTx]) claim(ctx context.Context, tx sqldriver.Executor, ev Event) (Outcome, error) {
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
	fresh, err := i.applyVersion(ctx, tx, ev.Entity, ev.Version)
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
// transaction of the update it guards.
func (i *Inbox[TTx]) ApplyVersionTx(ctx context.Context, tx TTx, entity string, version int64) (bool, error) {
	return i.applyVersion(ctx, i.driver.UnwrapExecutor(tx), entity, version)
}

// ApplyVersion is ApplyVersionTx as a standalone operation.
func (i *Inbox[TTx]) ApplyVersion(ctx context.Context, entity string, version int64) (bool, error) {
	return i.applyVersion(ctx, i.driver.Executor(), entity, version)
}

func (i *Inbox[TTx]) applyVersion(ctx context.Context, tx sqldriver.Executor, entity string, version int64) (bool, error) {
	if entity == "" || len(entity) > 255 {
		return false, errors.New("idem/inbox: the entity must be 1 to 255 bytes")
	}
	n, err := tx.Exec(ctx, i.sql.version, entity, version)
	if err == nil && n == 0 && i.mysql {
		// No row raised: a new entity's is inserted; if another
		// transaction inserted one first (the insert waited for it and was
		// ignored), that row is raised if it holds an older version.
		if n, err = tx.Exec(ctx, i.sql.versionInsert, entity, version); err == nil && n == 0 {
			n, err = tx.Exec(ctx, i.sql.version, entity, version)
		}
	}
	if err != nil {
		return false, fmt.Errorf("idem/inbox: version guard %s@%d: %w", entity, version, err)
	}
	return n == 1, nil
}

// Sweep deletes up to limit keys processed more than olderThan ago and
// returns how many. Run it in a loop (idem.Sweeper style) to bound the table;
// a duplicate that arrives after its key was swept runs again, so keep keys
// longer than the broker can redeliver.
func (i *Inbox[TTx]) Sweep(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if limit <= 0 {
		limit = 1000
	}
	n, err := i.driver.Executor().Exec(ctx, i.sql.sweep, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("idem/inbox: sweep: %w", err)
	}
	return int(n), nil
}

// Row is one processed key.
type Row struct {
	Consumer, CorrelationID, Type, ConsumerVersion string
	ProcessedAt                                    time.Time
}

// List returns up to limit processed keys after the key (afterConsumer,
// afterID) — "" and "" for the first page — in key order, of consumer only
// when it is set. Pass the last row's Consumer and CorrelationID for the
// next page (keyset pagination: every page costs the same).
func (i *Inbox[TTx]) List(ctx context.Context, consumer, afterConsumer, afterID string, limit int) ([]Row, error) {
	if limit <= 0 {
		limit = 100
	}
	return i.rows(ctx, i.sql.list, consumer, afterConsumer, afterID, limit)
}

func (i *Inbox[TTx]) rows(ctx context.Context, query string, args ...any) ([]Row, error) {
	rs, err := i.driver.Executor().Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("idem/inbox: list: %w", err)
	}
	defer rs.Close()
	var out []Row
	for rs.Next() {
		var r Row
		if err := rs.Scan(&r.Consumer, &r.CorrelationID, &r.Type, sqldriver.Time(&r.ProcessedAt), &r.ConsumerVersion); err != nil {
			return nil, fmt.Errorf("idem/inbox: list: %w", err)
		}
		out = append(out, r)
	}
	return out, rs.Err()
}

// Find returns the rows of correlationID, one per consumer that processed
// it (at most 100). It reads the whole table when no index leads with
// correlation_id: an operator's search, not a hot path.
func (i *Inbox[TTx]) Find(ctx context.Context, correlationID string) ([]Row, error) {
	return i.rows(ctx, i.sql.find, correlationID)
}

// Process runs fn and records ev in one transaction begun by the driver.
// fn runs only for a new key; a Duplicate or Stale event commits nothing of
// fn's. If fn fails, everything rolls back and the redelivery runs it again.
// What it reports processed is committed durably before it returns (on
// PostgreSQL even where the session's synchronous_commit is off: the claim
// raises it for its transaction, as ClaimTx's and ProcessBatch's do), so
// acknowledging it to the broker loses nothing when the database crashes.
func (i *Inbox[TTx]) Process(ctx context.Context, ev Event, fn func(ctx context.Context, tx TTx) error) (Outcome, error) {
	if i.cfg.TracerProvider == nil {
		return i.process(ctx, ev, fn)
	}
	ctx, span := i.cfg.TracerProvider.Tracer(ScopeName).Start(ctx, "idem.inbox.process",
		trace.WithAttributes(attribute.String("idem.consumer", ev.Consumer)))
	out, err := i.process(ctx, ev, fn)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.String("idem.outcome", out.String()))
	}
	span.End()
	return out, err
}

// ScopeName is the instrumentation scope of the inbox's spans.
const ScopeName = "github.com/idemgo/idem/inbox"

func (i *Inbox[TTx]) process(ctx context.Context, ev Event, fn func(ctx context.Context, tx TTx) error) (Outcome, error) {
	tx, out, err := i.beginClaimed(ctx, ev)
	if err != nil || out == Duplicate {
		return out, err
	}
	defer i.driver.Rollback(context.WithoutCancel(ctx), tx)
	if out == Processed {
		if err := fn(ctx, tx); err != nil {
			return 0, err
		}
	}
	if err := i.driver.Commit(ctx, tx); err != nil {
		return 0, fmt.Errorf("idem/inbox: commit: %w", err)
	}
	return out, nil
}

// beginClaimed begins a transaction and claims ev's key in it: with BEGIN in
// one round trip where the driver can (sqldriver.ClaimBeginner; not for a
// version-guarded event), else Begin and ClaimTx. The transaction is left
// open only for Processed and Stale.
func (i *Inbox[TTx]) beginClaimed(ctx context.Context, ev Event) (tx TTx, out Outcome, err error) {
	if cb, ok := any(i.driver).(sqldriver.ClaimBeginner[TTx]); ok && ev.Entity == "" && !i.cfg.ClaimSeparately {
		if err := ev.validate(); err != nil {
			return tx, 0, err
		}
		tx, err := cb.BeginClaim(ctx, i.sql.claimStrict, ev.Consumer, ev.CorrelationID, ev.Type, i.cfg.ConsumerVersion)
		if errors.Is(err, sqldriver.ErrRowExists) {
			return tx, Duplicate, nil
		}
		if err != nil {
			return tx, 0, fmt.Errorf("idem/inbox: begin and claim %s/%s: %w", ev.Consumer, ev.CorrelationID, err)
		}
		return tx, Processed, nil
	}
	if tx, err = i.driver.Begin(ctx); err != nil {
		return tx, 0, fmt.Errorf("idem/inbox: begin: %w", err)
	}
	if out, err = i.ClaimTx(ctx, tx, ev); err != nil || out == Duplicate {
		_ = i.driver.Rollback(context.WithoutCancel(ctx), tx)
	}
	return tx, out, err
}
