package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/store"
)

// maxBatch bounds the calls of one shared statement. An acquisition holds
// its key's advisory lock until its commit; 64 keeps a batch within the
// default max_locks_per_transaction.
const maxBatch = 64

type acquireCall struct {
	key, fp     string
	lease, keep int64 // ms
	maxAttempts int32
}

type settleCall struct {
	key    string
	fence  int64
	keep   int64 // ms
	state  int16
	result []byte
}

// acquireMany decides a batch of acquisitions: one statement per set of
// equal lease, retention and attempt limit (the statement takes those once;
// a Guard's calls share them). A statement refused for a value one request
// holds (a data exception, SQLSTATE class 22) is retried call by call, so
// only that call fails; a statement that failed for the store's sake
// fails every call of it, and nothing of it was applied.
func (s *Store) acquireMany(ctx context.Context, calls []acquireCall, out []store.Acquisition, errs []error) {
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		x, y := &calls[a], &calls[b]
		if c := cmpParams(x, y); c != 0 {
			return c
		}
		return strings.Compare(x.key, y.key)
	})
	for start := 0; start < len(order); {
		end := start + 1
		for end < len(order) && cmpParams(&calls[order[start]], &calls[order[end]]) == 0 {
			end++
		}
		s.acquireGroup(ctx, calls, order[start:end], out, errs)
		start = end
	}
}

func cmpParams(x, y *acquireCall) int {
	return cmp.Or(cmp.Compare(x.lease, y.lease), cmp.Compare(x.keep, y.keep), cmp.Compare(x.maxAttempts, y.maxAttempts))
}

// acquireGroup runs one statement for the calls at idx (sorted by key,
// equal parameters).
func (s *Store) acquireGroup(ctx context.Context, calls []acquireCall, idx []int, out []store.Acquisition, errs []error) {
	if len(idx) == 1 {
		out[idx[0]], errs[idx[0]] = s.acquireOne(ctx, calls[idx[0]])
		return
	}
	st := &s.sql
	keys, fps := make([]string, len(idx)), make([]string, len(idx))
	for j, i := range idx {
		keys[j], fps[j] = calls[i].key, calls[i].fp
	}
	first := &calls[idx[0]]
	err := func() error {
		rows, err := s.pool.Query(ctx, st.acquireMany, keypack.KeysArg(keys), keypack.FingerprintsArg(fps), first.lease, first.keep, first.maxAttempts)
		if err != nil {
			return err
		}
		defer rows.Close()
		answered := 0
		for rows.Next() {
			var outcome int16
			rec, err := st.scanRecord(rows, &outcome)
			if err != nil {
				return err
			}
			j, found := slices.BinarySearch(keys, rec.Key)
			if !found {
				return fmt.Errorf("the statement answered for key %q, not asked", rec.Key)
			}
			out[idx[j]] = acquisition(outcome, rec)
			answered++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if answered != len(keys) {
			return fmt.Errorf("the statement answered for %d of %d keys", answered, len(keys))
		}
		return nil
	}()
	if err == nil {
		return
	}
	if refusedForItsInput(err) {
		for _, i := range idx {
			out[i], errs[i] = s.acquireOne(ctx, calls[i])
		}
		return
	}
	err = wrap("acquire", err)
	for _, i := range idx {
		out[i], errs[i] = store.Acquisition{}, err
	}
}

// settleMany settles a batch (completions and failures together) in one
// statement; a key it did not settle had a stale fence. Failures are
// handled as acquireMany's.
func (s *Store) settleMany(ctx context.Context, calls []settleCall, _ []struct{}, errs []error) {
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(calls[a].key, calls[b].key) })
	st := &s.sql
	keys := make([]string, len(calls))
	fences := make([]int64, len(calls))
	keeps := make([]int64, len(calls))
	states := make([]int16, len(calls))
	results := make([][]byte, len(calls))
	for j, i := range order {
		c := &calls[i]
		keys[j], fences[j], keeps[j], states[j], results[j] = c.key, c.fence, c.keep, c.state, c.result
	}
	settled := make([]bool, len(calls))
	err := func() error {
		rows, err := s.pool.Query(ctx, st.settleMany, keypack.KeysArg(keys), fences, keeps, states, results)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var packed []byte
			var applied bool // false: a placeholder for a key that is gone
			if err := rows.Scan(&packed, &applied); err != nil {
				return err
			}
			k := keypack.Key(string(packed))
			j, found := slices.BinarySearch(keys, k)
			if !found {
				return fmt.Errorf("the statement settled key %q, not asked", k)
			}
			settled[j] = applied
		}
		return rows.Err()
	}()
	switch {
	case err == nil:
		for j, i := range order {
			if !settled[j] {
				errs[i] = store.ErrStaleFence
			}
		}
	case refusedForItsInput(err):
		for _, i := range order {
			_, errs[i] = s.settleOne(ctx, calls[i])
		}
	default:
		err = wrap("settle", err)
		for i := range errs {
			errs[i] = err
		}
	}
}

// refusedForItsInput: PostgreSQL refused the statement for a value it was
// given (data exceptions, class 22), not for its own state.
func refusedForItsInput(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}
