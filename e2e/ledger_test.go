package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// businessDB is the kind of database a campaign keeps its books in.
type businessDB struct {
	name string
	// start starts a server of the test's own and returns where its books
	// are (a URL, and on PostgreSQL the schema), its host:port, and its
	// crash: SIGKILL, then a start again on its files.
	start func(t *testing.T) (loc, schema, addr string, crash func() error)
}

// postgresBooks keeps the books on PostgreSQL, through pgx.
var postgresBooks = businessDB{name: "PostgreSQL", start: func(t *testing.T) (string, string, string, func() error) {
	db := testenv.StartPostgres(t)
	_, schema := testenv.PostgresSchemaOn(t, db.URL, func(string) string { return "" })
	return db.URL, schema, db.Addr(), db.Restart
}}

// mariaDBBooks keeps the books on MariaDB, through database/sql.
var mariaDBBooks = businessDB{name: "MariaDB", start: func(t *testing.T) (string, string, string, func() error) {
	srv := testenv.StartMariaDB(t)
	return srv.URL, "", srv.Addr(), srv.Restart
}}

// ledger is a campaign's business database: the sender's debits and its
// outbox, the receiver's credits and balances and its inbox.
type ledger interface {
	// migrate makes the tables (once, by the campaign's own process).
	migrate(ctx context.Context) error
	// commitTransfer debits an account and enqueues the transfer to dest
	// in one transaction, which it rolls back one time in six
	// (errRolledBack).
	commitTransfer(ctx context.Context, rng *rand.Rand, dest string) error
	// unbooked counts the committed transfers without a credit; booked,
	// those with one; pending, the outbox rows still to send.
	unbooked(ctx context.Context) (int, error)
	booked(ctx context.Context) (int, error)
	pending(ctx context.Context) (int, error)
	// check compares both ends' business rows, and returns the keys of the
	// debits without a credit.
	check(t *testing.T, ordered bool) (lost []string)
	// relayStore is the outbox a relay sends.
	relayStore() *outbox.Store
	// receiver books with the inbox, crediting as consumer process proc.
	receiver(proc int, batches bool, decided func(key string, d broker.Decision)) receiver
}

// openLedger opens the books at loc (postgres:// or mysql://) with
// connections that give up on a server that does not answer.
func openLedger(t testing.TB, loc, schema string) ledger {
	if strings.HasPrefix(loc, "mysql://") {
		db := testenv.OpenMySQL(t, loc+"?timeout=2s")
		return newBooks(t, databasesql.New(db, sqldriver.MySQL), "")
	}
	return newBooks(t, pgxv5.New(testenv.CampaignPool(t, loc, nil)), schema)
}

// books is a ledger through idem's SQL driver of the database.
type books[TTx any] struct {
	driver sqldriver.Driver[TTx]
	ob     *outbox.Outbox[TTx]
	ib     *inbox.Inbox[TTx]
	p      string // the tables' prefix: "schema." or ""
}

func newBooks[TTx any](t testing.TB, driver sqldriver.Driver[TTx], schema string) *books[TTx] {
	b := &books[TTx]{driver: driver}
	if schema != "" {
		b.p = schema + "."
	}
	var err error
	if b.ob, err = outbox.New(driver, outbox.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.ob.Close() })
	if b.ib, err = inbox.New(driver, inbox.Config{Table: b.p + "processed_events", VersionTable: b.p + "entity_versions"}); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *books[TTx]) migrate(ctx context.Context) error {
	if err := b.ob.Migrate(ctx); err != nil {
		return err
	}
	if err := b.ib.Migrate(ctx); err != nil {
		return err
	}
	ex := b.driver.Executor()
	accountRows := make([]string, accounts)
	for i := range accountRows {
		accountRows[i] = "('ACC-" + strconv.Itoa(i) + "', 0)"
	}
	for _, stmt := range []string{
		// The sender's side: a debit per committed transfer.
		`CREATE TABLE P.debits (tkey varchar(64) PRIMARY KEY, account varchar(16) NOT NULL, cents bigint NOT NULL, seq bigint NOT NULL)`,
		// Each account's last transfer number, its row locked by the
		// transfer's transaction.
		`CREATE TABLE P.account_seqs (account varchar(16) PRIMARY KEY, seq bigint NOT NULL)`,
		// The receiver's side: a credit per booking, deliberately without
		// a unique key (the inbox is what stops a second booking), and the
		// balances the credits add up to.
		`CREATE TABLE P.credits (id ` + b.driver.Dialect().SerialKey() + `, tkey varchar(64) NOT NULL, body_key varchar(64) NOT NULL,
			account varchar(16) NOT NULL, cents bigint NOT NULL, seq bigint NOT NULL, proc int NOT NULL)`,
		`CREATE INDEX credits_tkey ON P.credits (tkey)`,
		`CREATE INDEX credits_account ON P.credits (account, id)`,
		`CREATE TABLE P.balances (account varchar(16) PRIMARY KEY, cents bigint NOT NULL)`,
		`INSERT INTO P.account_seqs (account, seq) VALUES ` + strings.Join(accountRows, ", "),
		`INSERT INTO P.balances (account, cents) VALUES ` + strings.Join(accountRows, ", "),
	} {
		if _, err := ex.Exec(ctx, b.sql(stmt)); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// sql is query with its tables' prefix.
func (b *books[TTx]) sql(query string) string { return strings.ReplaceAll(query, "P.", b.p) }

func (b *books[TTx]) commitTransfer(ctx context.Context, rng *rand.Rand, dest string) error {
	tx, err := b.driver.Begin(ctx)
	if err != nil {
		return err
	}
	defer b.driver.Rollback(context.WithoutCancel(ctx), tx)
	key, err := outbox.NewUUIDKey()
	if rng.IntN(2) == 0 { // half the keys from the outbox's counters
		key, err = b.ob.NextKeyTx(ctx, tx, "TRF", time.Now())
	}
	if err != nil {
		return err
	}
	ex := b.driver.UnwrapExecutor(tx)
	tr := transfer{Key: key, Account: "ACC-" + strconv.Itoa(rng.IntN(accounts)), Cents: 1 + rng.Int64N(100_000)}
	if _, err := ex.Exec(ctx, b.sql(`UPDATE P.account_seqs SET seq = seq + 1 WHERE account = $1`), tr.Account); err != nil {
		return err
	}
	if err := ex.QueryRow(ctx, b.sql(`SELECT seq FROM P.account_seqs WHERE account = $1`), tr.Account).Scan(&tr.Seq); err != nil {
		return err
	}
	if _, err := ex.Exec(ctx, b.sql(`INSERT INTO P.debits (tkey, account, cents, seq) VALUES ($1, $2, $3, $4)`), tr.Key, tr.Account, tr.Cents, tr.Seq); err != nil {
		return err
	}
	payload, _ := json.Marshal(tr)
	if err := b.ob.EnqueueTx(ctx, tx, outbox.Message{Key: key, Destination: dest, Payload: payload, OrderingKey: tr.Account}); err != nil {
		return err
	}
	if rng.IntN(6) == 0 {
		return errRolledBack
	}
	return b.driver.Commit(ctx, tx)
}

func (b *books[TTx]) count(ctx context.Context, query string) (int, error) {
	var n int
	err := b.driver.Executor().QueryRow(ctx, b.sql(query)).Scan(&n)
	return n, err
}

func (b *books[TTx]) unbooked(ctx context.Context) (int, error) {
	return b.count(ctx, `SELECT count(*) FROM P.debits d WHERE NOT EXISTS (SELECT 1 FROM P.credits c WHERE c.tkey = d.tkey)`)
}

func (b *books[TTx]) booked(ctx context.Context) (int, error) {
	return b.count(ctx, `SELECT count(DISTINCT tkey) FROM P.credits`)
}

func (b *books[TTx]) pending(ctx context.Context) (int, error) {
	counts, err := b.ob.CountByStatus(ctx)
	return int(counts[outbox.Pending]), err
}

func (b *books[TTx]) relayStore() *outbox.Store { return b.ob.Store }

func (b *books[TTx]) check(t *testing.T, ordered bool) (lost []string) {
	ctx := context.Background()
	ex := b.driver.Executor()
	rows, err := ex.Query(ctx, b.sql(`SELECT d.tkey FROM P.debits d WHERE NOT EXISTS (SELECT 1 FROM P.credits c WHERE c.tkey = d.tkey) ORDER BY d.tkey`))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		lost = append(lost, k)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	violations := 0
	each := func(what, query string, columns int) {
		rows, err := ex.Query(ctx, b.sql(query))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		vals := make([]any, columns)
		dest := make([]any, columns)
		for i := range vals {
			dest[i] = &vals[i]
		}
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				t.Fatal(err)
			}
			for i, v := range vals {
				if raw, ok := v.([]byte); ok { // database/sql's text
					vals[i] = string(raw)
				}
			}
			if violations++; violations <= 20 {
				t.Errorf("VIOLATION: %s: %v", what, vals)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	key := b.driver.Dialect().Ident("key")
	each("lost: a committed debit without its credit (key, account, cents)",
		`SELECT d.tkey, d.account, d.cents FROM P.debits d WHERE NOT EXISTS (SELECT 1 FROM P.credits c WHERE c.tkey = d.tkey)`, 3)
	each("twice: a debit credited more than once (key, credits, first and last consumer processes)",
		`SELECT tkey, count(*), min(proc), max(proc) FROM P.credits GROUP BY tkey HAVING count(*) > 1`, 4)
	each("phantom: a credit without a committed debit (key, account, cents)",
		`SELECT c.tkey, c.account, c.cents FROM P.credits c WHERE NOT EXISTS (SELECT 1 FROM P.debits d WHERE d.tkey = c.tkey)`, 3)
	each("someone else's: a credit unlike its debit (key, body's key, credited account and cents, debited account and cents)",
		`SELECT c.tkey, c.body_key, c.account, c.cents, d.account, d.cents FROM P.credits c JOIN P.debits d ON d.tkey = c.tkey
		 WHERE c.body_key <> c.tkey OR c.account <> d.account OR c.cents <> d.cents`, 6)
	each("a balance unlike its debits' sum (account, balance, debited)",
		`SELECT b.account, b.cents, coalesce(d.cents, 0) FROM P.balances b
		 LEFT JOIN (SELECT account, sum(cents) AS cents FROM P.debits GROUP BY account) d ON d.account = b.account
		 WHERE b.cents <> coalesce(d.cents, 0)`, 3)
	each("a dead outbox row (key, tries, last error)", `SELECT `+key+`, tries, last_error FROM P.idem_outbox WHERE status = 'dead'`, 3)
	if ordered {
		// Credits are inserted in booking order (id); an account's must
		// follow its transfers' commit order (seq).
		each("out of order: an account's transfer booked after a later one (account, seq booked first, seq booked after)",
			`SELECT c1.account, c1.seq, c2.seq FROM P.credits c1 JOIN P.credits c2 ON c2.account = c1.account AND c2.id > c1.id
			 WHERE c2.seq < c1.seq`, 3)
	}
	var debits, booked, tries int64
	if err := ex.QueryRow(ctx, b.sql(`SELECT count(*), coalesce(sum(CASE WHEN c.n = 1 THEN 1 ELSE 0 END), 0), coalesce(sum(o.tries), 0)
		FROM P.debits d JOIN P.idem_outbox o ON o.`+key+` = d.tkey
		LEFT JOIN (SELECT tkey, count(*) AS n FROM P.credits GROUP BY tkey) c ON c.tkey = d.tkey`)).Scan(&debits, &booked, &tries); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of %d committed transfers booked once each at the receiver; their outbox rows counted %d tries in all", booked, debits, tries)
	if violations > 20 {
		t.Errorf("… %d violations in all", violations)
	}
	return lost
}

func (b *books[TTx]) receiver(proc int, batches bool, decided func(string, broker.Decision)) receiver {
	return &bookkeeper[TTx]{books: b, proc: proc, batches: batches, decide: decided}
}

// receiver is what a consumer process books with: the transactional inbox,
// the business change, and how the adapter runs them.
type receiver interface {
	// book runs one message through the inbox: its key recorded and its
	// credit made in one transaction.
	book(ctx context.Context, key string, body []byte) (inbox.Outcome, error)
	// batched: through the adapter's InboxBatches (many messages, one
	// transaction, a savepoint each) rather than InboxHandler.
	batched() bool
	// decided hears each decision the adapter applied to a message of key.
	decided(key string, d broker.Decision)
	// natsBatches and amqpBatches are the adapters' InboxBatches handlers
	// crediting each message.
	natsBatches(cfg natsidem.Config) (jetstream.MessageHandler, error)
	amqpBatches(cfg amqpidem.Config) (func(amqp.Delivery), error)
}

// bookkeeper is the receiver of consumer process proc.
type bookkeeper[TTx any] struct {
	*books[TTx]
	proc    int
	batches bool
	decide  func(string, broker.Decision)
}

func (r *bookkeeper[TTx]) batched() bool                         { return r.batches }
func (r *bookkeeper[TTx]) decided(key string, d broker.Decision) { r.decide(key, d) }

func (r *bookkeeper[TTx]) book(ctx context.Context, key string, body []byte) (inbox.Outcome, error) {
	return r.ib.Process(ctx, inbox.Event{Consumer: inboxConsumer, CorrelationID: key}, func(ctx context.Context, tx TTx) error {
		return r.credit(ctx, tx, key, body)
	})
}

// credit makes one transfer's business change in tx; key is what the
// consumer read from the protocol's own field.
func (r *bookkeeper[TTx]) credit(ctx context.Context, tx TTx, key string, body []byte) error {
	var m transfer
	if err := json.Unmarshal(body, &m); err != nil {
		return fmt.Errorf("message %s: %w", key, err)
	}
	ex := r.driver.UnwrapExecutor(tx)
	if _, err := ex.Exec(ctx, r.sql(`INSERT INTO P.credits (tkey, body_key, account, cents, seq, proc) VALUES ($1, $2, $3, $4, $5, $6)`),
		key, m.Key, m.Account, m.Cents, m.Seq, r.proc); err != nil {
		return err
	}
	n, err := ex.Exec(ctx, r.sql(`UPDATE P.balances SET cents = cents + $1 WHERE account = $2`), m.Cents, m.Account)
	if err == nil && n != 1 {
		err = errors.New("no balance of account " + m.Account)
	}
	return err
}

func (r *bookkeeper[TTx]) natsBatches(cfg natsidem.Config) (jetstream.MessageHandler, error) {
	h, err := natsidem.InboxBatches(cfg, natsidem.Batch[TTx]{Inbox: r.ib, Size: batchSize,
		Process: func(ctx context.Context, tx TTx, msg jetstream.Msg) error {
			return r.credit(ctx, tx, msg.Headers().Get(nats.MsgIdHdr), msg.Data())
		}})
	if err != nil {
		return nil, err
	}
	return h.Handle, nil
}

func (r *bookkeeper[TTx]) amqpBatches(cfg amqpidem.Config) (func(amqp.Delivery), error) {
	h, err := amqpidem.InboxBatches(cfg, amqpidem.Batch[TTx]{Inbox: r.ib, Size: batchSize,
		Process: func(ctx context.Context, tx TTx, d *amqp.Delivery) error {
			return r.credit(ctx, tx, d.MessageId, d.Body)
		}})
	if err != nil {
		return nil, err
	}
	return h.Handle, nil
}

// helperLedger opens the books of a helper process, at the location its
// number gave it.
func helperLedger(t testing.TB) ledger {
	return openLedger(t, os.Getenv(envDB), os.Getenv(envSchema))
}
