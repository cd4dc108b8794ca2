package mysqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem/internal/coalesce"
	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/internal/sqlrecord"
	"github.com/idemgo/idem/store"
)

// maxBatch bounds the calls of one shared round trip.
const maxBatch = 64

// inFlight is how many round trips run at once. Measured on MariaDB 10.11
// (2 cores, 32 goroutines, lifecycles/s): 1 in flight 3,761 (16 calls a
// trip), 2 4,373 (12), 4 2,518 (8): two keep the server busy while a batch
// is built and answered; more compete for its cores.
const inFlight = 2

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
	return coalesce.New(coalesce.Config[writeCall]{MaxBatch: maxBatch, MaxInFlight: inFlight, Key: func(c writeCall) string { return c.key }},
		func(ctx context.Context, c writeCall) (store.Acquisition, error) {
			return s.writeAlone(ctx, &c)
		}, s.writeMany)
}

// write runs c alone or, while the store is busy, in the next shared round
// trip.
func (s *Store) write(ctx context.Context, c writeCall) (store.Acquisition, error) {
	if s.writes == nil {
		return s.writeAlone(ctx, &c)
	}
	return s.writes.Do(ctx, c)
}

// statements appends c's statements to b and their arguments to args: an
// acquisition (the claim and its read-back) or a settle (its UPDATE and
// the rows it matched, as a SELECT).
func (s *Store) statements(b *strings.Builder, args []any, c *writeCall, now int64) []any {
	if c.acquire {
		b.WriteString(acquireSQL.text)
		b.WriteString(";\n")
		t := s.clock.Now()
		return append(args, acquireSQL.bind(&params{key: keypack.KeyArg(c.key), fp: keypack.FingerprintArg(c.fp), now: now,
			lease: c.lease, keep: c.keep, max: c.maxAttempts, floor: int64(fences.Next(t, 0))})...)
	}
	b.WriteString(settleSQL.text)
	b.WriteString(";\nSELECT ROW_COUNT();\n")
	return append(args, settleSQL.bind(&params{key: keypack.KeyArg(c.key), fence: c.fence, now: now, keep: c.keep, state: c.state, result: c.result})...)
}

// writeAlone runs one call: a settle as its UPDATE, an acquisition in its
// own transaction with its read-back.
func (s *Store) writeAlone(ctx context.Context, c *writeCall) (store.Acquisition, error) {
	if !c.acquire {
		return store.Acquisition{}, s.owned(ctx, c.op, settleSQL, &params{key: keypack.KeyArg(c.key), fence: c.fence,
			now: s.nowMs(), keep: c.keep, state: c.state, result: c.result})
	}
	out, errs := make([]store.Acquisition, 1), make([]error, 1)
	s.writeMany(ctx, []writeCall{*c}, out, errs)
	return out[0], errs[0]
}

// writeMany runs calls in one transaction sent as one multi-statement
// query, in key order (two transactions take their rows' locks in the same
// order, so shared round trips do not deadlock each other), with one
// commit. A server error on the way — a deadlock with a client of its
// own, a lock wait timeout — rolls the transaction back and each call
// runs again alone, for an answer of its own; a lost connection fails
// every call unavailable (the commit may or may not have happened).
func (s *Store) writeMany(ctx context.Context, calls []writeCall, out []store.Acquisition, errs []error) {
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(calls[a].key, calls[b].key) })
	var b strings.Builder
	b.WriteString("START TRANSACTION;\n")
	var args []any
	now := s.nowMs()
	for _, i := range order {
		args = s.statements(&b, args, &calls[i], now)
	}
	b.WriteString("COMMIT")
	err := s.inTransaction(ctx, b.String(), args, func(rows *sql.Rows) error {
		for n, i := range order {
			if n > 0 && !rows.NextResultSet() {
				return cmp.Or(rows.Err(), errNoRecord)
			}
			if !rows.Next() {
				return cmp.Or(rows.Err(), errNoRecord)
			}
			c := &calls[i]
			if c.acquire {
				var outcome int
				rec, err := sqlrecord.Scan(rows, &outcome)
				if err != nil {
					return err
				}
				a := store.Acquisition{Outcome: store.Outcome(outcome), Record: rec}
				if a.Outcome.Owns() {
					a.Fence = rec.Fence
				}
				out[i], errs[i] = a, nil
				continue
			}
			var n int64
			if err := rows.Scan(&n); err != nil {
				return err
			}
			out[i], errs[i] = store.Acquisition{}, nil
			if n == 0 {
				errs[i] = store.ErrStaleFence
			}
		}
		return nil
	})
	if err == nil {
		return
	}
	var me *mysql.MySQLError
	if len(calls) > 1 && errors.As(err, &me) {
		for i := range calls {
			out[i], errs[i] = s.writeAlone(ctx, &calls[i])
		}
		return
	}
	for i := range calls {
		op := calls[i].op
		if calls[i].acquire {
			op = "acquire"
		}
		out[i], errs[i] = store.Acquisition{}, s.wrap(op, err)
	}
}

// inTransaction sends query — START TRANSACTION; …; COMMIT — on a
// connection of its own, hands its rows to read, and checks that the
// commit went through. On an error the transaction is rolled back on that
// connection (a server error leaves it open), so no connection goes back
// to the pool inside a transaction.
func (s *Store) inTransaction(ctx context.Context, query string, args []any, read func(*sql.Rows) error) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	rows, err := conn.QueryContext(ctx, query, args...)
	if err == nil {
		err = read(rows)
		for err == nil && rows.NextResultSet() { // the COMMIT's answer
		}
		if err == nil {
			err = rows.Err()
		}
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil && !badConn(err) {
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // discarded, not pooled
		}
	}
	return err
}

// CoalesceStats returns how many shared round trips the store ran and how
// many calls they carried (zeros with Config.NoCoalesce).
func (s *Store) CoalesceStats() (transactions, calls int64) {
	if s.writes == nil {
		return 0, 0
	}
	return s.writes.Stats()
}
