// Package pgxv5 is the sqldriver.Driver of PostgreSQL through a pgx v5
// pool. Its users hold pgx.Tx transactions; it listens for notifications
// (LISTEN/NOTIFY), so readers such as the outbox relay wake as soon as a
// row commits.
package pgxv5

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/internal/ctxsleep"
	"github.com/idemgo/idem/sqldriver"
)

var _ sqldriver.ClaimBeginner[pgx.Tx] = (*Driver)(nil)

// Driver reaches PostgreSQL through a pgx pool.
type Driver struct {
	pool   *pgxpool.Pool
	noWake bool // WithoutListen

	mu     sync.Mutex
	listen *pgxpool.Conn // held while a Wait listens
	chans  map[string]bool
}

// New returns the driver of pool. The pool stays the caller's to close;
// Close releases only the driver's listening connection.
func New(pool *pgxpool.Pool, opts ...Option) *Driver {
	d := &Driver{pool: pool}
	for _, o := range opts {
		o(d)
	}
	return d
}

// Option configures a Driver.
type Option func(*Driver)

// WithoutListen makes readers poll instead of listening for notifications:
// for a pool behind PgBouncer in transaction pooling mode, where LISTEN
// runs on a server connection the pool hands to someone else right after
// (configure that pool with DefaultQueryExecMode = pgx.QueryExecModeExec
// too: prepared statements do not survive transaction pooling).
func WithoutListen() Option { return func(d *Driver) { d.noWake = true } }

var (
	_ sqldriver.Driver[pgx.Tx] = (*Driver)(nil)
	_ sqldriver.Listener       = (*Driver)(nil)
)

// Dialect is sqldriver.Postgres.
func (*Driver) Dialect() sqldriver.Dialect { return sqldriver.Postgres }

// Executor runs on the pool.
func (d *Driver) Executor() sqldriver.Executor { return executor{d.pool} }

// UnwrapExecutor runs in tx.
func (*Driver) UnwrapExecutor(tx pgx.Tx) sqldriver.Executor { return executor{tx} }

// Begin starts a transaction on the pool.
func (d *Driver) Begin(ctx context.Context) (pgx.Tx, error) { return d.pool.Begin(ctx) }

// Commit commits tx.
func (*Driver) Commit(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }

// Rollback rolls tx back; after Commit it is a no-op.
func (*Driver) Rollback(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// BeginClaim implements sqldriver.ClaimBeginner: BEGIN and the insert, its
// arguments as literals escaped for the connection (pgconn.EscapeString:
// standard_conforming_strings must be on, the default), in one simple-query
// round trip. A unique violation rolls back (a round trip more, for
// duplicates only) and is sqldriver.ErrRowExists.
func (d *Driver) BeginClaim(ctx context.Context, insert string, args ...string) (pgx.Tx, error) {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	q, err := literals(c.Conn().PgConn(), insert, args)
	if err != nil {
		c.Release()
		return nil, err
	}
	tx, err := c.Conn().BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; " + q})
	if err != nil {
		if c.Conn().PgConn().TxStatus() != 'I' {
			_, _ = c.Conn().Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		c.Release()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
			return nil, sqldriver.ErrRowExists
		}
		return nil, err
	}
	return &connTx{Tx: tx, conn: c}, nil
}

// literals puts the escaped string literals of args in place of $1…$n, in
// one pass (a value that reads "$2" stays text). q is the component's own
// statement: it has no $ of its own.
func literals(pc *pgconn.PgConn, q string, args []string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		if q[i] != '$' {
			b.WriteByte(q[i])
			continue
		}
		j := i + 1
		for j < len(q) && q[j] >= '0' && q[j] <= '9' {
			j++
		}
		n, err := strconv.Atoi(q[i+1 : j])
		if err != nil || n < 1 || n > len(args) {
			return "", fmt.Errorf("idem/pgxv5: placeholder %q of %d arguments", q[i:j], len(args))
		}
		if strings.IndexByte(args[n-1], 0) >= 0 {
			// A simple query is a C string: PostgreSQL would stop reading at
			// the NUL. As a parameter the server refuses it too (22021).
			return "", fmt.Errorf("idem/pgxv5: argument $%d holds a NUL byte, which PostgreSQL text cannot", n)
		}
		esc, err := pc.EscapeString(args[n-1])
		if err != nil {
			return "", err
		}
		b.WriteString("'" + esc + "'")
		i = j - 1
	}
	return b.String(), nil
}

// connTx is a transaction on a connection acquired from the pool, released
// when the transaction ends (as pgxpool.Tx does).
type connTx struct {
	pgx.Tx
	conn *pgxpool.Conn
	once sync.Once
}

func (t *connTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.once.Do(t.conn.Release)
	return err
}

func (t *connTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	t.once.Do(t.conn.Release)
	return err
}

// lockMigrations is the one advisory lock every idem migration takes.
const lockMigrations = `SELECT pg_advisory_xact_lock(hashtext('idem_migrate'))`

// Locked runs fn in a transaction holding idem's migration advisory lock.
func (d *Driver) Locked(ctx context.Context, fn func(sqldriver.Executor) error) error {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, lockMigrations); err != nil {
		return err
	}
	if err := fn(executor{tx}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Listen subscribes the listening connection to channel (acquiring the
// connection from the pool the first time).
func (d *Driver) Listen(ctx context.Context, channel string) error {
	if d.noWake {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.listenLocked(ctx, channel)
}

func (d *Driver) listenLocked(ctx context.Context, channel string) error {
	if d.listen == nil {
		c, err := d.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		d.listen, d.chans = c, map[string]bool{}
	}
	if !d.chans[channel] {
		if _, err := d.listen.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			d.dropListener()
			return err
		}
		d.chans[channel] = true
	}
	return nil
}

// listenRetry is the longest a Wait that could not listen pauses.
const listenRetry = time.Second

// Wait blocks until channel is notified (true), or d passes or the
// listening connection fails (false; within a second when it cannot
// listen at all). One connection of the pool listens;
// it is kept between calls and replaced when it fails.
func (d *Driver) Wait(ctx context.Context, channel string, timeout time.Duration) bool {
	if d.noWake {
		_ = ctxsleep.Sleep(ctx, timeout)
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.listenLocked(ctx, channel); err != nil {
		// No listening connection (the server down, or a pooled connection
		// that died with it): back to the caller within a second, which
		// looks for work and waits again — not a whole timeout later.
		_ = ctxsleep.Sleep(ctx, min(timeout, listenRetry))
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := d.listen.Conn().WaitForNotification(wctx); err == nil {
		return true // any notification on a listened channel is a reason to look
	}
	if wctx.Err() == nil || ctx.Err() != nil {
		// The connection failed, or we are stopping mid-wait (the
		// connection's state is unknown): start again next time.
		d.dropListener()
	}
	return false
}

func (d *Driver) dropListener() {
	d.listen.Conn().Close(context.Background())
	d.listen.Release()
	d.listen, d.chans = nil, nil
}

// Close releases the listening connection, if any.
func (d *Driver) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.listen != nil {
		d.listen.Release()
		d.listen, d.chans = nil, nil
	}
}

// querier is what pgx.Tx, *pgxpool.Pool and *pgx.Conn have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type executor struct{ q querier }

func (e executor) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := e.q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (e executor) Query(ctx context.Context, sql string, args ...any) (sqldriver.Rows, error) {
	rows, err := e.q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

func (e executor) QueryRow(ctx context.Context, sql string, args ...any) sqldriver.Row {
	return e.q.QueryRow(ctx, sql, args...)
}
