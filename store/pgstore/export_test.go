package pgstore

import (
	"context"

	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/store"
)

// AcquireBatch runs reqs as one coalesced batch, as the Store does with
// calls that wait for it together.
func AcquireBatch(ctx context.Context, s *Store, reqs []store.AcquireRequest) ([]store.Acquisition, []error) {
	calls := make([]acquireCall, len(reqs))
	for i, r := range reqs {
		calls[i] = acquireCall{key: r.Key, fp: r.Fingerprint, lease: r.Lease.Milliseconds(),
			keep: max(r.Retention, r.Lease).Milliseconds(), maxAttempts: int32(r.MaxAttempts)}
	}
	out, errs := make([]store.Acquisition, len(reqs)), make([]error, len(reqs))
	s.acquireMany(ctx, calls, out, errs)
	return out, errs
}

// CompleteBatch completes (key, fence) pairs as one coalesced batch.
func CompleteBatch(ctx context.Context, s *Store, keys []string, fences []uint64, result []byte) []error {
	calls := make([]settleCall, len(keys))
	for i, k := range keys {
		calls[i] = settleCall{key: k, fence: int64(fences[i]), keep: 3600_000, state: int16(store.StateCompleted), result: result}
	}
	errs := make([]error, len(keys))
	s.settleMany(ctx, calls, nil, errs)
	return errs
}

// DeleteStatement is the statement Delete runs ($1 the key), for a test that
// holds a delete's transaction open.
func (s *Store) DeleteStatement() string { return s.sql.del }

// KeyArg is the argument of key in the store's statements (its packed
// form).
func (s *Store) KeyArg(key string) any { return keypack.KeyArg(key) }

// WritesDurably reports whether the store's writes raise a
// synchronous_commit of off for their own transactions.
func (s *Store) WritesDurably() bool { return s.durably }
