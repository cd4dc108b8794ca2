package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/idemgo/idem/internal/sqlmigrate"
	"github.com/idemgo/idem/sqldriver"
)

// Status of an outbox row.
type Status string

// The statuses.
const (
	Pending Status = "pending"
	Sent    Status = "sent"
	Acked   Status = "acked"
	Dead    Status = "dead"
	// Skipped: a dead row an operator gave up on (Store.Skip), so that the
	// later rows of its ordering key are sent.
	Skipped Status = "skipped"
)

// ParseStatus checks s.
func ParseStatus(s string) (Status, error) {
	switch st := Status(s); st {
	case Pending, Sent, Acked, Dead, Skipped:
		return st, nil
	}
	return "", fmt.Errorf("idem/outbox: unknown status %q (want pending, sent, acked, dead or skipped)", s)
}

// Errors.
var (
	// ErrKeyReused: the key is in the outbox with another destination or
	// payload.
	ErrKeyReused = errors.New("idem/outbox: key already used for another message")
	// ErrNotFound: no row has the key.
	ErrNotFound = errors.New("idem/outbox: no message with that key")
)

// Message is one intent to send.
type Message struct {
	// Key is the idempotency key, sent on every attempt. Required.
	Key string
	// Destination names where to send it; its scheme chooses the sender
	// (http://, https://, nats://, amqp://, …). Required.
	Destination string
	// Payload is sent as is.
	Payload []byte
	// Headers are sent with the payload where the protocol has headers.
	Headers map[string]string
	// ExternalID, if set, is the id under which the receiver knows the
	// message — the AS2 Message-ID, one per message: an asynchronous
	// receipt finds the row by it (GetByExternalID). At most 255 bytes.
	ExternalID string
	// OrderingKey, if set, orders the message after the earlier messages
	// of the same ordering key (an aggregate's id: an account, an order):
	// it is not sent while an earlier one is unfinished — pending, claimed
	// by a relay or waiting for a retry — or dead (unless the relay lets
	// dead rows release their keys), by any relay. "Earlier" is the order
	// of the rows' ids, which is the order their transactions inserted
	// them: serialize the transactions of one ordering key (lock the
	// aggregate's row) and it is their commit order. Senders carry it in
	// the OrderingKeyHeader header, and where their protocol has a place
	// for it: Kafka's record key (one partition per key), AMQP's routing
	// key where the destination asks for it. At most 255 bytes.
	OrderingKey string
}

// Row is a message with its delivery state.
type Row struct {
	Message
	ID            int64
	Status        Status
	Tries         int
	LastError     string
	NextAttemptAt time.Time
	CreatedAt     time.Time
	SentAt        time.Time
	AckedAt       time.Time
	// BlockedBy is, for a pending row, the key of the dead row of its
	// ordering key that holds it back ("" when none).
	BlockedBy string
}

// OrderingKeyHeader is the header the senders write a message's ordering
// key into, where their protocol has headers (HTTP, NATS, AMQP, Kafka).
const OrderingKeyHeader = "Idem-Ordering-Key"

// Limits on a message.
const (
	MaxKeyBytes         = 255
	MaxDestinationBytes = 2048
	MaxPayloadBytes     = 16 << 20
)

func (m *Message) validate() error {
	switch {
	case m.Key == "" || len(m.Key) > MaxKeyBytes:
		return fmt.Errorf("idem/outbox: the key must be 1 to %d bytes", MaxKeyBytes)
	case m.Destination == "" || len(m.Destination) > MaxDestinationBytes:
		return fmt.Errorf("idem/outbox: the destination must be 1 to %d bytes", MaxDestinationBytes)
	case !strings.Contains(m.Destination, ":"):
		return fmt.Errorf("idem/outbox: destination %q has no scheme", m.Destination)
	case len(m.ExternalID) > MaxKeyBytes:
		return fmt.Errorf("idem/outbox: the external id must be at most %d bytes", MaxKeyBytes)
	case len(m.OrderingKey) > MaxKeyBytes:
		return fmt.Errorf("idem/outbox: the ordering key must be at most %d bytes", MaxKeyBytes)
	case len(m.Payload) > MaxPayloadBytes:
		return fmt.Errorf("idem/outbox: the payload is %d bytes, the limit is %d", len(m.Payload), MaxPayloadBytes)
	}
	for i := 0; i < len(m.Key); i++ {
		if m.Key[i] < 0x20 || m.Key[i] > 0x7e {
			return fmt.Errorf("idem/outbox: the key must be printable ASCII (it travels in protocol headers)")
		}
	}
	return nil
}

var ident = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Config configures an outbox.
type Config struct {
	// Schema holds the tables ("" for the search_path, or SQLite's main
	// database). A plain name.
	Schema string
}

// Store is the outbox table of one database, for everything done outside
// the application's transactions: the relay, the operator's tools (Get,
// List, Ack, Retry, Purge, Stats), Enqueue on its own.
type Store struct {
	d      sqldriver.Dialect
	db     sqldriver.Executor
	schema string // "" or "name."
	q      queries
	listen sqldriver.Listener // nil: the relay polls
	// migrations runs Migrate's transaction under the migration lock.
	migrations sqlmigrate.Conn
	// inTx runs fn in a transaction of its own (MySQL's claims and
	// counters take two statements).
	inTx func(ctx context.Context, fn func(tx sqldriver.Executor) error) error
}

// Outbox is the Store written in the application's transactions, of type
// TTx (pgx.Tx, *sql.Tx): EnqueueTx, NextKeyTx.
type Outbox[TTx any] struct {
	*Store
	driver sqldriver.Driver[TTx]
}

// New returns the outbox of the database reached by driver
// (pgxv5.New(pool), databasesql.New(db, sqldriver.SQLite), …). A driver
// that listens for notifications (pgxv5) wakes the relay as soon as a row
// commits; with the others the relay polls.
func New[TTx any](driver sqldriver.Driver[TTx], cfg Config) (*Outbox[TTx], error) {
	if cfg.Schema != "" && !ident.MatchString(cfg.Schema) {
		return nil, fmt.Errorf("idem/outbox: schema %q is not a plain name", cfg.Schema)
	}
	s := newStore(driver.Dialect(), driver.Executor(), cfg.Schema)
	s.migrations = driver
	s.listen, _ = any(driver).(sqldriver.Listener)
	s.inTx = func(ctx context.Context, fn func(tx sqldriver.Executor) error) error {
		tx, err := driver.Begin(ctx)
		if err != nil {
			return err
		}
		if err := fn(driver.UnwrapExecutor(tx)); err != nil {
			_ = driver.Rollback(context.WithoutCancel(ctx), tx)
			return err
		}
		return driver.Commit(ctx, tx)
	}
	return &Outbox[TTx]{Store: s, driver: driver}, nil
}

// notifyChannel is what the outbox's trigger signals on PostgreSQL.
const notifyChannel = "idem_outbox"

func (s *Store) t(name string) string { return s.schema + name }

// Schema returns the DDL (idempotent) of the outbox and its counters.
func (s *Store) Schema() string {
	if s.d == sqldriver.MySQL {
		return s.mysqlSchema()
	}
	now := s.d.Now()
	ts := s.d.TimeType()
	ddl := `CREATE TABLE IF NOT EXISTS ` + s.t("idem_outbox") + ` (
	id              ` + s.d.SerialKey() + `,
	key             text NOT NULL UNIQUE,   -- the idempotency key, sent on every attempt
	destination     text NOT NULL,          -- scheme://… chooses the sender
	payload         ` + s.d.BinaryType() + ` NOT NULL,
	headers         text NOT NULL DEFAULT '{}',  -- a JSON object of strings
	status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'acked', 'dead', 'skipped')),
	tries           integer NOT NULL DEFAULT 0,
	last_error      text NOT NULL DEFAULT '',
	next_attempt_at ` + ts + ` NOT NULL DEFAULT (` + now + `),
	created_at      ` + ts + ` NOT NULL DEFAULT (` + now + `),
	sent_at         ` + ts + `,
	acked_at        ` + ts + `,
	claimed_by      text,                   -- the relay batch holding the row
	claimed_until   ` + ts + `,               -- its lease; a dead relay's claim expires
	external_id     text,                   -- the protocol's own id (an AS2 Message-ID), where it has one
	ordering_key    text,                   -- rows of one ordering key are sent one at a time, in id order
	trace_context   text                    -- the enqueuing span's W3C trace context, a JSON object
);
` + s.d.CreateIndex(strings.TrimSuffix(s.schema, "."), "idem_outbox_due", "idem_outbox", "(next_attempt_at, id) WHERE status = 'pending'") + `;
` + s.d.CreateIndex(strings.TrimSuffix(s.schema, "."), "idem_outbox_external_id", "idem_outbox", "(external_id)") + `;
` + s.d.CreateIndex(strings.TrimSuffix(s.schema, "."), "idem_outbox_ordering", "idem_outbox", "(ordering_key, id) WHERE ordering_key IS NOT NULL AND status IN ('pending', 'dead')") + `;
CREATE TABLE IF NOT EXISTS ` + s.t("idem_outbox_counters") + ` (
	name  text PRIMARY KEY,
	value bigint NOT NULL
);`
	if trigger := s.d.NotifyTrigger(strings.TrimSuffix(s.schema, "."), "idem_outbox", notifyChannel); trigger != "" {
		ddl += "\n" + trigger
	}
	return ddl
}

type queries struct {
	insert, insertAlone, existing, counter, claim, claimPastDead, extend, sent, unclaim, failed, ack, ackSent, retry, skip, list, get, getExternal, refuse, purge string

	// conflicts: $1 claim token, then ordering keys: the keys that have a
	// row claimed under another token, pending or dead, under a live lease.
	conflicts string
	// MySQL's (see mysqlQueries).
	counterRead, claimMark, acked string
}

func newStore(d sqldriver.Dialect, db sqldriver.Executor, schema string) *Store {
	s := &Store{d: d, db: db}
	if schema != "" {
		s.schema = schema + "."
	}
	tbl := s.t("idem_outbox")
	// The columns of a Row, of the table as o: BlockedBy is the first dead
	// row of a pending row's ordering key before it.
	cols := `o.id, o.key, o.destination, o.payload, o.headers, coalesce(o.external_id, ''), coalesce(o.ordering_key, ''), o.status, o.tries,
	o.last_error, o.next_attempt_at, o.created_at, o.sent_at, o.acked_at,
	CASE WHEN o.status = 'pending' AND o.ordering_key IS NOT NULL THEN coalesce((SELECT e.key FROM ` + tbl + ` e
		WHERE e.ordering_key = o.ordering_key AND e.id < o.id AND e.status = 'dead' ORDER BY e.id LIMIT 1), '') ELSE '' END`
	// The relay's writes — a claim, its renewals, the outcomes — commit
	// durably whatever the session's synchronous_commit (as Enqueue does):
	// a claim lost in a crash of the server lets another relay send the row
	// while the first still does.
	durably := d.Durably()
	// claim: $1 claim token, $2 lease ms, $3 batch size. A row of an
	// ordering key is claimable once no earlier row of its key is
	// unfinished (any pending row, claimed or not, and — unless
	// pastDead — a dead one): it is the first unfinished row of its key,
	// found by idem_outbox_ordering. A claimed row whose key has another
	// row claimed meanwhile is given back (see keyConflicts). The due rows are walked in
	// idem_outbox_due's order, (next_attempt_at, id), so a claim reads
	// about a batch of rows, not every pending one. (The test is "id <=
	// that first id", which is "=" for a pending row: an equality of a
	// subquery is estimated so selective that PostgreSQL would sort every
	// pending row instead.)
	claim := func(pastDead bool) string {
		unfinished := `'pending', 'dead'`
		if pastDead {
			unfinished = `'pending'`
		}
		return `UPDATE ` + tbl + ` SET claimed_by = $1, claimed_until = ` + s.d.NowPlusMillis("$2") + `
WHERE ` + durably + ` AND id IN (SELECT o.id FROM ` + tbl + ` o WHERE o.status = 'pending' AND o.next_attempt_at <= ` + s.d.Now() + `
	AND (o.claimed_until IS NULL OR o.claimed_until < ` + s.d.Now() + `)
	AND (o.ordering_key IS NULL OR o.id <= (SELECT min(e.id) FROM ` + tbl + ` e
		WHERE e.ordering_key = o.ordering_key AND e.status IN (` + unfinished + `)))
	ORDER BY o.next_attempt_at, o.id LIMIT $3` + d.SkipLocked() + `)
RETURNING id, key, destination, payload, headers, coalesce(external_id, ''), coalesce(ordering_key, ''), coalesce(trace_context, ''), tries`
	}
	s.q = queries{
		insert: `INSERT INTO ` + tbl + ` (key, destination, payload, headers, external_id, ordering_key, trace_context) VALUES ($1, $2, $3, $4, NULLIF($5, ''), NULLIF($6, ''), NULLIF($7, '')) ON CONFLICT (key) DO NOTHING`,
		// Enqueue alone: committed durably before it returns, whatever the
		// session's synchronous_commit (EnqueueTx's commit is the caller's).
		insertAlone: `INSERT INTO ` + tbl + ` (key, destination, payload, headers, external_id, ordering_key, trace_context) SELECT $1, $2, $3, $4, NULLIF($5, ''), NULLIF($6, ''), NULLIF($7, '') WHERE ` + durably + ` ON CONFLICT (key) DO NOTHING`,
		existing:    `SELECT destination, payload FROM ` + tbl + ` WHERE key = $1`,
		counter: `INSERT INTO ` + s.t("idem_outbox_counters") + ` AS c (name, value) VALUES ($1, 1)
ON CONFLICT (name) DO UPDATE SET value = c.value + 1 RETURNING value`,
		claim:         claim(false),
		claimPastDead: claim(true),
		// $1 claim token, $2 status, then ids
		sent: `UPDATE ` + tbl + ` SET status = $2, tries = tries + 1, last_error = '', sent_at = ` + s.d.Now() + `,
	acked_at = CASE WHEN $2 = 'acked' THEN ` + s.d.Now() + ` ELSE acked_at END, claimed_by = NULL, claimed_until = NULL
WHERE ` + durably + ` AND claimed_by = $1 AND status = 'pending' AND `,
		// $1 claim token, $2 lease ms, then ids
		extend: `UPDATE ` + tbl + ` SET claimed_until = ` + s.d.NowPlusMillis("$2") + ` WHERE ` + durably + ` AND claimed_by = $1 AND `,
		// $1 claim token, then ids
		unclaim: `UPDATE ` + tbl + ` SET claimed_by = NULL, claimed_until = NULL WHERE ` + durably + ` AND claimed_by = $1 AND `,
		// $1 claim token, $2 id, $3 error, $4 backoff ms, $5 dead (0/1 as status text)
		failed: `UPDATE ` + tbl + ` SET status = $5, tries = tries + 1, last_error = $3,
	next_attempt_at = ` + s.d.NowPlusMillis("$4") + `, claimed_by = NULL, claimed_until = NULL
WHERE ` + durably + ` AND claimed_by = $1 AND id = $2 AND status = 'pending'`,
		ack:     `UPDATE ` + tbl + ` SET status = 'acked', acked_at = ` + s.d.Now() + ` WHERE key = $1 AND status IN ('pending', 'sent', 'acked')`,
		ackSent: `UPDATE ` + tbl + ` SET status = 'acked', acked_at = coalesce(acked_at, ` + s.d.Now() + `) WHERE key = $1 AND status IN ('sent', 'acked')`,
		retry:   `UPDATE ` + tbl + ` SET status = 'pending', next_attempt_at = ` + s.d.Now() + `, claimed_by = NULL, claimed_until = NULL WHERE key = $1 AND status = 'dead'`,
		skip:    `UPDATE ` + tbl + ` SET status = 'skipped' WHERE key = $1 AND status = 'dead'`,
		// $1 after id, $2 status or '', $3 limit, $4 destination prefix or ''
		list: `SELECT ` + cols + ` FROM ` + tbl + ` o WHERE o.id > $1 AND ($2 = '' OR o.status = $2)
	AND ($4 = '' OR substr(o.destination, 1, length($4)) = $4) ORDER BY o.id LIMIT $3`,
		get:         `SELECT ` + cols + ` FROM ` + tbl + ` o WHERE o.key = $1`,
		getExternal: `SELECT ` + cols + ` FROM ` + tbl + ` o WHERE o.external_id = $1`,
		// $1 key, $2 reason, $3 new status (pending: retried now; dead)
		refuse: `UPDATE ` + tbl + ` SET status = $3, last_error = $2, next_attempt_at = ` + s.d.Now() + `, claimed_by = NULL, claimed_until = NULL
WHERE key = $1 AND status = 'sent'`,
		// $1 age ms, $2 limit
		purge: `DELETE FROM ` + tbl + ` WHERE id IN (SELECT id FROM ` + tbl + ` WHERE status IN ('sent', 'acked')
	AND coalesce(acked_at, sent_at) < ` + s.d.NowPlusMillis("-$1") + ` ORDER BY id LIMIT $2)`,
	}
	s.q.conflicts = `SELECT DISTINCT ordering_key FROM ` + tbl + ` WHERE ` + claimedOfAKey + ` AND claimed_until >= ` + s.d.Now() + `
	AND claimed_by <> $1 AND `
	if d == sqldriver.MySQL {
		s.mysqlQueries(cols)
	}
	return s
}

// Migrations returns the outbox's numbered migrations. Version 1 creates
// the tables (Schema, written with IF NOT EXISTS: tables created from it
// by hand are adopted as they are). Version 2 indexes the claimed rows of
// each ordering key, which a relay reads after each claim (keyConflicts);
// on MySQL, version 1 has that index already.
func (s *Store) Migrations() []sqlmigrate.Step {
	steps := []sqlmigrate.Step{{Version: 1, Name: "outbox and counters", SQL: s.Schema()}}
	if s.d != sqldriver.MySQL {
		steps = append(steps, sqlmigrate.Step{Version: 2, Name: "claimed rows by ordering key",
			SQL: s.d.CreateIndex(strings.TrimSuffix(s.schema, "."), "idem_outbox_claimed", "idem_outbox", "(ordering_key) WHERE "+claimedOfAKey)})
	}
	return steps
}

// claimedOfAKey is the predicate of the index of claimed rows
// (idem_outbox_claimed): the rows of an ordering key that a claim holds or
// held, unfinished. keyConflicts's query states it word for word, as SQLite
// needs to use a partial index.
const claimedOfAKey = `ordering_key IS NOT NULL AND claimed_by IS NOT NULL AND status IN ('pending', 'dead')`

// Migrate creates or upgrades the outbox's tables: the missing numbered
// migrations, in one transaction under the migration lock (an advisory lock
// on PostgreSQL, BEGIN IMMEDIATE on SQLite), recorded in idem_migrations.
// Any number of processes may run it at once; it is idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := sqlmigrate.Apply(ctx, s.migrations, strings.TrimSuffix(s.schema, "."), "outbox", s.Migrations()); err != nil {
		return fmt.Errorf("idem/outbox: migrate: %w", err)
	}
	keys := sqlmigrate.KeyColumns{s.t("idem_outbox"): {"key", "external_id", "ordering_key"}, s.t("idem_outbox_counters"): {"name"}}
	if err := sqlmigrate.CheckKeyColumns(ctx, s.migrations, keys); err != nil {
		return fmt.Errorf("idem/outbox: migrate: %w", err)
	}
	return nil
}

// EnqueueTx records m in tx, the caller's transaction: it is sent only if
// tx commits. The span of ctx, if any (OpenTelemetry), is recorded with it:
// the relay's send continues that trace. Enqueueing an existing key again with the same destination
// and payload is a no-op; with another, ErrKeyReused.
func (o *Outbox[TTx]) EnqueueTx(ctx context.Context, tx TTx, m Message) error {
	return o.enqueue(ctx, o.driver.UnwrapExecutor(tx), o.q.insert, m)
}

// Enqueue records m on its own (no business change with it), committed
// durably before it returns: on PostgreSQL even where the session's
// synchronous_commit is off, under which a crash loses the last commits
// acknowledged, or turned off while the program runs
// (TestEnqueueSurvivesAServerCrash…): its statement carries the condition
// that raises the setting for its own transaction (Dialect.Durably).
func (s *Store) Enqueue(ctx context.Context, m Message) error {
	return s.enqueue(ctx, s.db, s.q.insertAlone, m)
}

func (s *Store) enqueue(ctx context.Context, tx sqldriver.Executor, insert string, m Message) error {
	if err := m.validate(); err != nil {
		return err
	}
	headers := "{}"
	if len(m.Headers) > 0 {
		b, err := json.Marshal(m.Headers)
		if err != nil {
			return err
		}
		headers = string(b)
	}
	payload := m.Payload
	if payload == nil {
		payload = []byte{}
	}
	n, err := tx.Exec(ctx, insert, m.Key, m.Destination, payload, headers, m.ExternalID, m.OrderingKey, traceContextOf(ctx))
	if err != nil {
		return fmt.Errorf("idem/outbox: enqueue %s: %w", m.Key, err)
	}
	if n == 1 {
		return nil
	}
	var dest string
	var existing []byte
	if err := tx.QueryRow(ctx, s.q.existing, m.Key).Scan(&dest, &existing); err != nil {
		return fmt.Errorf("idem/outbox: enqueue %s: %w", m.Key, err)
	}
	if dest != m.Destination || !bytes.Equal(existing, payload) {
		return fmt.Errorf("%w: %s", ErrKeyReused, m.Key)
	}
	return nil
}

// NextKeyTx returns the next key of typ for today (UTC):
// <typ>-<yyyymmdd>-<counter>, the counter taken from a persisted table in
// tx, so it is allocated once, before the first send, and never reused —
// even across restarts and several writers.
func (o *Outbox[TTx]) NextKeyTx(ctx context.Context, tx TTx, typ string, now time.Time) (string, error) {
	return o.nextKey(ctx, o.driver.UnwrapExecutor(tx), typ, now)
}

// NextKey is NextKeyTx in a transaction of its own.
func (s *Store) NextKey(ctx context.Context, typ string, now time.Time) (key string, err error) {
	if s.d != sqldriver.MySQL {
		return s.nextKey(ctx, s.db, typ, now)
	}
	err = s.inTx(ctx, func(tx sqldriver.Executor) error {
		key, err = s.nextKey(ctx, tx, typ, now)
		return err
	})
	return key, err
}

func (s *Store) nextKey(ctx context.Context, tx sqldriver.Executor, typ string, now time.Time) (string, error) {
	if typ == "" || strings.ContainsAny(typ, " \t\r\n") || len(typ) > 64 {
		return "", errors.New("idem/outbox: the key type must be 1 to 64 bytes without spaces")
	}
	day := now.UTC().Format("20060102")
	n, err := s.nextCounter(ctx, tx, typ+"-"+day)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s-%s-%04d", typ, day, n), nil
}

// NextCounterTx increments the persisted counter name in tx and returns its
// new value (1 for a new counter). Numbers allocated in a transaction that
// rolls back are given out again; committed ones never.
func (o *Outbox[TTx]) NextCounterTx(ctx context.Context, tx TTx, name string) (int64, error) {
	return o.nextCounter(ctx, o.driver.UnwrapExecutor(tx), name)
}

// NextCounter is NextCounterTx in a transaction of its own.
func (s *Store) NextCounter(ctx context.Context, name string) (n int64, err error) {
	if s.d != sqldriver.MySQL {
		return s.nextCounter(ctx, s.db, name)
	}
	err = s.inTx(ctx, func(tx sqldriver.Executor) error {
		n, err = s.nextCounter(ctx, tx, name)
		return err
	})
	return n, err
}

func (s *Store) nextCounter(ctx context.Context, tx sqldriver.Executor, name string) (int64, error) {
	var n int64
	var err error
	if s.d == sqldriver.MySQL {
		// The increment holds the row's lock until the transaction ends:
		// the value read back is this transaction's.
		if _, err = tx.Exec(ctx, s.q.counter, name); err == nil {
			err = tx.QueryRow(ctx, s.q.counterRead, name).Scan(&n)
		}
	} else {
		err = tx.QueryRow(ctx, s.q.counter, name).Scan(&n)
	}
	if err != nil {
		return 0, fmt.Errorf("idem/outbox: counter %s: %w", name, err)
	}
	return n, nil
}

// GetTx is Get inside tx.
func (o *Outbox[TTx]) GetTx(ctx context.Context, tx TTx, key string) (Row, error) {
	return o.get(ctx, o.driver.UnwrapExecutor(tx), key)
}

// Get returns the row of key.
func (s *Store) Get(ctx context.Context, key string) (Row, error) { return s.get(ctx, s.db, key) }

// GetByExternalID returns the row whose Message.ExternalID is id, or
// ErrNotFound.
func (s *Store) GetByExternalID(ctx context.Context, id string) (Row, error) {
	rs, err := s.db.Query(ctx, s.q.getExternal, id)
	if err != nil {
		return Row{}, fmt.Errorf("idem/outbox: get by external id: %w", err)
	}
	out, err := collect(rs)
	if err != nil {
		return Row{}, err
	}
	if len(out) == 0 {
		return Row{}, fmt.Errorf("%w: external id %s", ErrNotFound, id)
	}
	return out[0], nil
}

// Refuse records that the receiver's asynchronous receipt refused a sent
// message: reason goes to last_error, and the row is retried now
// (dead=false) or dead. Only a sent row changes (acked and dead are
// terminal; a pending one is being retried already).
func (s *Store) Refuse(ctx context.Context, key, reason string, dead bool) error {
	st := Pending
	if dead {
		st = Dead
	}
	n, err := s.db.Exec(ctx, s.q.refuse, key, lastError(reason), string(st))
	if err != nil {
		return fmt.Errorf("idem/outbox: refuse %s: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("%w (or it is not sent): %s", ErrNotFound, key)
	}
	return nil
}

func (s *Store) get(ctx context.Context, tx sqldriver.Executor, key string) (Row, error) {
	rs, err := tx.Query(ctx, s.q.get, key)
	if err != nil {
		return Row{}, fmt.Errorf("idem/outbox: get: %w", err)
	}
	out, err := collect(rs)
	if err != nil {
		return Row{}, err
	}
	if len(out) == 0 {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return out[0], nil
}

// NewUUIDKey returns a UUIDv7 key (time-ordered, so the outbox index stays
// append-mostly).
func NewUUIDKey() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// claimed is a row handed to a relay.
type claimed struct {
	ID    int64
	Tries int
	Message
	// trace is the enqueuing span's trace context ("" for none).
	trace string
}

// claim leases up to n due rows to token; pastDead: a dead row does not
// hold back the later rows of its ordering key.
func (s *Store) claim(ctx context.Context, token string, lease time.Duration, n int, pastDead bool) ([]claimed, error) {
	q := s.q.claim
	if pastDead {
		q = s.q.claimPastDead
	}
	var out []claimed
	var err error
	if s.d == sqldriver.MySQL {
		out, err = s.claimMySQL(ctx, q, token, lease.Milliseconds(), n)
	} else {
		var rs sqldriver.Rows
		if rs, err = s.db.Query(ctx, q, token, lease.Milliseconds(), n); err == nil {
			out, err = scanClaimed(rs, nil)
		}
		if err != nil {
			err = fmt.Errorf("idem/outbox: claim: %w", err)
		}
	}
	if err != nil {
		return nil, err
	}
	return s.keyConflicts(ctx, token, out)
}

// keyConflicts gives back the rows of out whose ordering key has another
// row claimed under a live lease — one row of a key in flight at a time.
// The claim takes a key's first unfinished row only, but an earlier row
// may be unfinished again while a later one is being sent (a sent row its
// receipt refused, a dead row retried past which the key's later rows went
// on), or commit after it. The check follows the claim's commit, so of two
// relays that claim rows of one key at once, at least one sees the other's
// claim.
func (s *Store) keyConflicts(ctx context.Context, token string, out []claimed) ([]claimed, error) {
	var keys []string
	for _, c := range out {
		if c.OrderingKey != "" && !slices.Contains(keys, c.OrderingKey) {
			keys = append(keys, c.OrderingKey)
		}
	}
	if len(keys) == 0 {
		return out, nil
	}
	cond, args := inStrings("ordering_key", 2, keys)
	rs, err := s.db.Query(ctx, s.q.conflicts+cond, append([]any{token}, args...)...)
	if err != nil {
		return nil, s.giveBackAll(ctx, token, out, err)
	}
	busy := map[string]bool{}
	for rs.Next() {
		var k string
		if err := rs.Scan(&k); err != nil {
			rs.Close()
			return nil, s.giveBackAll(ctx, token, out, err)
		}
		busy[k] = true
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return nil, s.giveBackAll(ctx, token, out, err)
	}
	if len(busy) == 0 {
		return out, nil
	}
	var back []int64
	kept := out[:0]
	for _, c := range out {
		if busy[c.OrderingKey] {
			back = append(back, c.ID)
		} else {
			kept = append(kept, c)
		}
	}
	if err := s.unclaim(ctx, token, back); err != nil {
		return nil, err
	}
	return kept, nil
}

// giveBackAll hands every row of out back after the check of their keys
// failed with err, and returns err.
func (s *Store) giveBackAll(ctx context.Context, token string, out []claimed, err error) error {
	ids := make([]int64, len(out))
	for i, c := range out {
		ids[i] = c.ID
	}
	_ = s.unclaim(context.WithoutCancel(ctx), token, ids)
	return fmt.Errorf("idem/outbox: claim: the ordering keys' other claims: %w", err)
}

// inStrings is a condition on column being one of vs, its parameters from
// $n on.
func inStrings(column string, n int, vs []string) (string, []any) {
	var b strings.Builder
	b.WriteString(column + " IN (")
	args := make([]any, len(vs))
	for i, v := range vs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("$" + strconv.Itoa(n+i))
		args[i] = v
	}
	b.WriteByte(')')
	return b.String(), args
}

// scanClaimed appends the claimed rows of rs to out, and closes rs.
func scanClaimed(rs sqldriver.Rows, out []claimed) ([]claimed, error) {
	defer rs.Close()
	for rs.Next() {
		var c claimed
		var headers string
		if err := rs.Scan(&c.ID, &c.Key, &c.Destination, &c.Payload, &headers, &c.ExternalID, &c.OrderingKey, &c.trace, &c.Tries); err != nil {
			return nil, err
		}
		if headers != "" && headers != "{}" {
			_ = json.Unmarshal([]byte(headers), &c.Headers) // a bad JSON from another writer: sent without headers
		}
		out = append(out, c)
	}
	return out, rs.Err()
}

// markSent records the success of ids claimed by token. A row acked or made
// dead meanwhile (Ack, an operator) keeps its status: those are terminal.
func (s *Store) markSent(ctx context.Context, token string, st Status, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	q, args := s.withIDs(s.q.sent, []any{token, string(st)}, ids)
	if _, err := s.db.Exec(ctx, q, args...); err != nil {
		return fmt.Errorf("idem/outbox: mark sent: %w", err)
	}
	return nil
}

// extend renews the lease of the rows of ids still claimed by token and
// returns how many it renewed.
func (s *Store) extend(ctx context.Context, token string, lease time.Duration, ids []int64) (int64, error) {
	q, args := s.withIDs(s.q.extend, []any{token, lease.Milliseconds()}, ids)
	n, err := s.db.Exec(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("idem/outbox: extend the claim: %w", err)
	}
	return n, nil
}

// unclaim hands rows claimed by token back unsent: due again at once.
func (s *Store) unclaim(ctx context.Context, token string, ids []int64) error {
	q, args := s.withIDs(s.q.unclaim, []any{token}, ids)
	if _, err := s.db.Exec(ctx, q, args...); err != nil {
		return fmt.Errorf("idem/outbox: hand back unsent rows: %w", err)
	}
	return nil
}

// withIDs ends q with a condition on id being one of ids.
func (s *Store) withIDs(q string, args []any, ids []int64) (string, []any) {
	cond, more := s.d.InInt64s("id", len(args)+1, ids)
	return q + cond, append(args, more...)
}

// lastError is cause as last_error keeps it: its first 2,000 bytes, cut
// at a character's boundary.
func lastError(cause string) string {
	if len(cause) <= 2000 {
		return cause
	}
	cut := 2000
	for cut > 0 && !utf8.RuneStart(cause[cut]) {
		cut--
	}
	return cause[:cut]
}

// markFailed records a failed attempt: back to pending after backoff, or
// dead.
func (s *Store) markFailed(ctx context.Context, token string, id int64, cause string, backoff time.Duration, dead bool) error {
	st := Pending
	if dead {
		st = Dead
	}
	if _, err := s.db.Exec(ctx, s.q.failed, token, id, lastError(cause), backoff.Milliseconds(), string(st)); err != nil {
		return fmt.Errorf("idem/outbox: mark failed: %w", err)
	}
	return nil
}

// Ack marks the message acked: its receipt arrived (an AS2 MDN, a business
// acknowledgement). Acking a pending message stops further sends. Acking
// an acked message is a no-op; a dead or unknown one is ErrNotFound.
func (s *Store) Ack(ctx context.Context, key string) error {
	n, err := s.db.Exec(ctx, s.q.ack, key)
	if err == nil {
		n, err = s.changedOrAcked(ctx, n, key)
	}
	if err != nil {
		return fmt.Errorf("idem/outbox: ack %s: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("%w (or it is dead): %s", ErrNotFound, key)
	}
	return nil
}

// AckSent marks a sent message acked: the receipt of what was delivered
// (an asynchronous AS2 MDN). Unlike Ack, it changes only a sent row (an
// acked one is a no-op): a pending row was never delivered, and a receipt
// for it proves nothing; that, a dead or an unknown row is ErrNotFound.
func (s *Store) AckSent(ctx context.Context, key string) error {
	n, err := s.db.Exec(ctx, s.q.ackSent, key)
	if err == nil {
		n, err = s.changedOrAcked(ctx, n, key)
	}
	if err != nil {
		return fmt.Errorf("idem/outbox: ack %s: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("%w (or it is not sent): %s", ErrNotFound, key)
	}
	return nil
}

// Retry moves a dead message back to pending, due now. It keeps its tries.
func (s *Store) Retry(ctx context.Context, key string) error {
	n, err := s.db.Exec(ctx, s.q.retry, key)
	if err != nil {
		return fmt.Errorf("idem/outbox: retry %s: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("%w among the dead messages: %s", ErrNotFound, key)
	}
	return nil
}

// Skip gives up on a dead message: it becomes skipped (kept, never sent),
// and the later messages of its ordering key are sent. Skipping anything
// but a dead message is ErrNotFound.
func (s *Store) Skip(ctx context.Context, key string) error {
	n, err := s.db.Exec(ctx, s.q.skip, key)
	if err != nil {
		return fmt.Errorf("idem/outbox: skip %s: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("%w among the dead messages: %s", ErrNotFound, key)
	}
	return nil
}

// List returns up to limit rows after id afterID, optionally of one status,
// in id order.
func (s *Store) List(ctx context.Context, status Status, afterID int64, limit int) ([]Row, error) {
	if limit <= 0 {
		limit = 1000
	}
	return s.ListTo(ctx, status, "", afterID, limit)
}

// ListTo is List of the rows whose destination starts with destPrefix (""
// for all).
func (s *Store) ListTo(ctx context.Context, status Status, destPrefix string, afterID int64, limit int) ([]Row, error) {
	if limit <= 0 {
		limit = 1000
	}
	rs, err := s.db.Query(ctx, s.q.list, afterID, string(status), limit, destPrefix)
	if err != nil {
		return nil, fmt.Errorf("idem/outbox: list: %w", err)
	}
	return collect(rs)
}

func collect(rs sqldriver.Rows) ([]Row, error) {
	defer rs.Close()
	var out []Row
	for rs.Next() {
		var r Row
		var headers, status string
		if err := rs.Scan(&r.ID, &r.Key, &r.Destination, &r.Payload, &headers, &r.ExternalID, &r.OrderingKey, &status, &r.Tries, &r.LastError,
			sqldriver.Time(&r.NextAttemptAt), sqldriver.Time(&r.CreatedAt), sqldriver.Time(&r.SentAt), sqldriver.Time(&r.AckedAt), &r.BlockedBy); err != nil {
			return nil, fmt.Errorf("idem/outbox: read rows: %w", err)
		}
		r.Status = Status(status)
		if headers != "" && headers != "{}" {
			_ = json.Unmarshal([]byte(headers), &r.Headers)
		}
		out = append(out, r)
	}
	return out, rs.Err()
}

// Stats are the figures an operator watches.
type Stats struct {
	Pending int64
	Dead    int64
	// OldestPending is the creation time of the oldest pending row (zero
	// when none): now minus it is the outbox lag.
	OldestPending time.Time
}

// CountByStatus counts the rows of each status (one query over the table:
// an overview, not a hot path).
func (s *Store) CountByStatus(ctx context.Context) (map[Status]int64, error) {
	rs, err := s.db.Query(ctx, `SELECT status, count(*) FROM `+s.t("idem_outbox")+` GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("idem/outbox: count: %w", err)
	}
	defer rs.Close()
	out := map[Status]int64{}
	for rs.Next() {
		var st string
		var n int64
		if err := rs.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("idem/outbox: count: %w", err)
		}
		out[Status(st)] = n
	}
	return out, rs.Err()
}

// Stats counts pending and dead rows and finds the oldest pending one.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	err := s.db.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM `+s.t("idem_outbox")+` WHERE status = 'pending'),
	(SELECT count(*) FROM `+s.t("idem_outbox")+` WHERE status = 'dead'),
	(SELECT min(created_at) FROM `+s.t("idem_outbox")+` WHERE status = 'pending')`).Scan(&st.Pending, &st.Dead, sqldriver.Time(&st.OldestPending))
	if err != nil {
		return Stats{}, fmt.Errorf("idem/outbox: stats: %w", err)
	}
	return st, nil
}

// Purge deletes up to limit sent or acked messages delivered more than
// olderThan ago and returns how many; pending and dead rows stay. Run it
// periodically (idem relay --keep does) so the table does not grow without
// bound; keep rows at least as long as a late receipt (Ack) may arrive.
func (s *Store) Purge(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if limit <= 0 {
		limit = 1000
	}
	n, err := s.db.Exec(ctx, s.q.purge, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("idem/outbox: purge: %w", err)
	}
	return int(n), nil
}
