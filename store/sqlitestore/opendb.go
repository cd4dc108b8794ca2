package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemgo/idem/internal/ctxsleep"
)

// DBOptions configures OpenDB. The zero value is idem's default.
type DBOptions struct {
	// Synchronous is "NORMAL" (the default) or "FULL"; see Config.
	Synchronous string
	// BusyTimeout is how long a statement waits for another process's write
	// lock, and how long OpenDB keeps trying to open a database that other
	// processes are creating at the same moment. Defaults to 5s.
	BusyTimeout time.Duration
	// MaxConns bounds the pool. Defaults to 1 (see Config.MaxConns).
	MaxConns int
}

// OpenDB opens the SQLite database at path the way every idem component
// uses it — WAL journal, the busy timeout, foreign keys on, BEGIN
// IMMEDIATE transactions — and returns it once a connection works.
//
// Several processes that start together on a file that does not exist yet
// race to switch it to WAL; SQLite answers the losers SQLITE_BUSY at once,
// without its busy handler. OpenDB retries those until BusyTimeout, so
// every one of them opens; any other error is returned at once.
func OpenDB(ctx context.Context, path string, o DBOptions) (*sql.DB, error) {
	if path == "" {
		return nil, errors.New("idem/sqlitestore: the database path is required")
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("idem/sqlitestore: the database path %q must not contain '?' or '#'", path)
	}
	sync := strings.ToUpper(o.Synchronous)
	switch sync {
	case "":
		sync = "NORMAL"
	case "NORMAL", "FULL":
	default:
		return nil, fmt.Errorf("idem/sqlitestore: synchronous is %q, want NORMAL or FULL", o.Synchronous)
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 1
	}
	dsn := fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(%s)&_pragma=foreign_keys(on)&_txlock=immediate",
		path, o.BusyTimeout.Milliseconds(), sync)
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("idem/sqlitestore: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(o.MaxConns)
	db.SetMaxIdleConns(o.MaxConns)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	deadline := time.Now().Add(o.BusyTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err = db.PingContext(ctx)
		if err == nil {
			return db, nil
		}
		if !isBusy(err) || time.Now().Add(wait).After(deadline) {
			break
		}
		if err = ctxsleep.Sleep(ctx, wait); err == nil {
			continue
		}
		break
	}
	db.Close()
	return nil, fmt.Errorf("idem/sqlitestore: open %s: %w", path, err)
}

func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}
