package sqlitestore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemgo/idem/internal/coalesce"
	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/store"
)

// maxBatch bounds the calls of one shared transaction.
const maxBatch = 64

// writeCall is an Acquire or a settle (Complete, Fail).
type writeCall struct {
	acquire     bool
	key, fp     string
	lease, keep int64 // ms: the lease, and the retention (settle) or the unsettled retention (acquire)
	maxAttempts int
	fence       int64
	state       int
	result      []byte
	op          string
}

func (s *Store) newWrites() *coalesce.Group[writeCall, store.Acquisition] {
	// One round trip in flight: SQLite has one writer at a time.
	return coalesce.New(coalesce.Config[writeCall]{MaxBatch: maxBatch, MaxInFlight: 1},
		func(ctx context.Context, c writeCall) (store.Acquisition, error) {
			return s.runWrite(ctx, s.acquire, s.settle, &c)
		}, s.writeMany)
}

// write runs c alone or, while another write is in flight, in the next
// shared transaction.
func (s *Store) write(ctx context.Context, c writeCall) (store.Acquisition, error) {
	if s.writes == nil {
		return s.runWrite(ctx, s.acquire, s.settle, &c)
	}
	return s.writes.Do(ctx, c)
}

func (s *Store) runWrite(ctx context.Context, acquire, settle *sql.Stmt, c *writeCall) (store.Acquisition, error) {
	if c.acquire {
		return s.acquireWith(ctx, acquire, c)
	}
	return store.Acquisition{}, s.owned(ctx, c.op, settle, keypack.KeyArg(c.key), c.fence, s.nowMs(), c.keep, c.state, c.result)
}

// writeMany runs calls in one BEGIN IMMEDIATE transaction, each its own
// statement in arrival order (as if they came one after the other), with
// one commit — on synchronous=FULL one fsync for them all. A statement that
// fails for its own input fails its call alone (SQLite undoes just that
// statement); a failure of the database (busy, I/O, full) or of the commit
// rolls everything back and fails every call: none was applied.
func (s *Store) writeMany(ctx context.Context, calls []writeCall, out []store.Acquisition, errs []error) {
	fail := func(err error) {
		for i := range errs {
			out[i], errs[i] = store.Acquisition{}, err
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		fail(s.wrap("begin", err))
		return
	}
	acquire, settle := tx.StmtContext(ctx, s.acquire), tx.StmtContext(ctx, s.settle)
	for i := range calls {
		out[i], errs[i] = s.runWrite(ctx, acquire, settle, &calls[i])
		if errors.Is(errs[i], store.ErrUnavailable) || errors.Is(errs[i], store.ErrClosed) || ctx.Err() != nil {
			_ = tx.Rollback()
			fail(errs[i])
			return
		}
	}
	if err := tx.Commit(); err != nil {
		fail(s.wrap("commit", err))
	}
}

// CoalesceStats returns how many shared transactions the store ran and how
// many calls they carried (zeros with Config.NoCoalesce).
func (s *Store) CoalesceStats() (transactions, calls int64) {
	if s.writes == nil {
		return 0, 0
	}
	return s.writes.Stats()
}
