package mysqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"maps"
	"math"
	"math/rand/v2"
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
// query, with one commit: the acquisitions of each MaxAttempts as one
// statement (many rows) and one read-back, then the settles as one UPDATE
// and one read-back of the keys it settled — each in key order. A server error on the way —
// a deadlock with another transaction, a lock wait timeout — rolls the
// transaction back and each call runs again alone, for an answer of its
// own; a lost connection fails every call unavailable (the commit may or
// may not have happened).
func (s *Store) writeMany(ctx context.Context, calls []writeCall, out []store.Acquisition, errs []error) {
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(calls[a].key, calls[b].key) })
	groups := map[int][]*writeCall{} // acquisitions by MaxAttempts
	var settles []*writeCall
	for _, i := range order {
		if c := &calls[i]; c.acquire {
			groups[c.maxAttempts] = append(groups[c.maxAttempts], c)
		} else {
			settles = append(settles, c)
		}
	}
	maxes := slices.Sorted(maps.Keys(groups))
	var b strings.Builder
	b.WriteString("START TRANSACTION;\n")
	var args []any
	now := s.nowMs()
	floor := func() int64 { return int64(fences.Next(s.clock.Now(), 0)) }
	for _, m := range maxes {
		args = acquireSQL(&b, args, groups[m], now, floor)
	}
	if len(settles) > 0 {
		args = settleManySQL(&b, args, settles, now, -1-rand.Int64N(math.MaxInt64-1))
	}
	b.WriteString("COMMIT")
	byKey := make(map[string]int, len(calls))
	for i := range calls {
		byKey[calls[i].key] = i
	}
	err := s.inTransaction(ctx, b.String(), args, func(rows *sql.Rows) error {
		first := true
		next := func() error {
			if !first && !rows.NextResultSet() {
				return cmp.Or(rows.Err(), errNoRecord)
			}
			first = false
			return nil
		}
		for _, m := range maxes {
			if err := next(); err != nil {
				return err
			}
			read := 0
			for rows.Next() {
				var outcome int
				rec, err := sqlrecord.Scan(rows, &outcome)
				if err != nil {
					return err
				}
				i, ok := byKey[rec.Key]
				if !ok || !calls[i].acquire {
					return errNoRecord
				}
				a := store.Acquisition{Outcome: store.Outcome(outcome), Record: rec}
				if a.Outcome.Owns() {
					a.Fence = rec.Fence
				}
				out[i], errs[i] = a, nil
				read++
			}
			if err := rows.Err(); err != nil {
				return err
			}
			if read != len(groups[m]) {
				return errNoRecord
			}
		}
		if len(settles) == 0 {
			return nil
		}
		if err := next(); err != nil {
			return err
		}
		settled := map[string]bool{}
		for rows.Next() {
			var k []byte
			if err := rows.Scan(&k); err != nil {
				return err
			}
			settled[keypack.Key(string(k))] = true
		}
		for _, c := range settles {
			i := byKey[c.key]
			out[i], errs[i] = store.Acquisition{}, nil
			if !settled[c.key] {
				errs[i] = store.ErrStaleFence
			}
		}
		return rows.Err()
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
