package outbox

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/internal/sqlmigrate"
)

// NewPgx returns the outbox of a PostgreSQL database reached through a pgx
// pool. schema ("" for the search_path) holds the tables. Its relay is woken
// by LISTEN/NOTIFY as soon as a row commits.
func NewPgx(pool *pgxpool.Pool, schema string) (*Store, error) {
	s, err := newStore(Postgres, pgxAdapter{pool}, schema)
	if err != nil {
		return nil, err
	}
	s.migrations = sqlmigrate.Pgx(pool)
	l := &listener{pool: pool}
	s.notify = l.wait
	s.close = l.close
	return s, nil
}

// NewSQL returns the outbox of a database/sql database: PostgreSQL (with
// the pgx stdlib driver) or SQLite (modernc.org/sqlite). Its relay polls.
func NewSQL(db *sql.DB, d Dialect, schema string) (*Store, error) {
	s, err := newStore(d, sqlAdapter{db}, schema)
	if err != nil {
		return nil, err
	}
	md := sqlmigrate.Postgres
	if d == SQLite {
		md = sqlmigrate.SQLite
	}
	s.migrations = sqlmigrate.SQL(db, md)
	return s, nil
}

// Close releases the LISTEN connection, if any. The pool or DB stays open.
func (s *Store) Close() error {
	if s.close != nil {
		s.close()
	}
	return nil
}

// listener holds one pool connection on LISTEN idem_outbox.
type listener struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	conn *pgxpool.Conn
}

// wait blocks until a notification arrives (true) or d passes (false).
func (l *listener) wait(ctx context.Context, d time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		c, err := l.pool.Acquire(ctx)
		if err != nil {
			sleep(ctx, d)
			return false
		}
		if _, err := c.Exec(ctx, "LISTEN idem_outbox"); err != nil {
			c.Release()
			sleep(ctx, d)
			return false
		}
		l.conn = c
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := l.conn.Conn().WaitForNotification(wctx)
	if err == nil {
		return true
	}
	if wctx.Err() == nil || ctx.Err() != nil {
		// The connection failed (or we are stopping): start again next time.
		l.conn.Conn().Close(context.Background())
		l.conn.Release()
		l.conn = nil
	}
	return false
}

func (l *listener) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Release()
		l.conn = nil
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// DB returns the store's own connection as a Tx, for work outside a
// transaction (NextKeyTx, Migrate in tools).
func (s *Store) DB() Tx { return s.db }
