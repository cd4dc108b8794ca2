package mysqlstore

import (
	"context"

	"github.com/idemgo/idem/store"
)

// AcquireMany runs reqs as one shared round trip, as the coalescing does.
func (s *Store) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) ([]store.Acquisition, []error) {
	calls := make([]writeCall, len(reqs))
	for i, r := range reqs {
		calls[i] = writeCall{acquire: true, key: r.Key, fp: r.Fingerprint, lease: r.Lease.Milliseconds(),
			keep: max(r.Retention, r.Lease).Milliseconds(), maxAttempts: r.MaxAttempts}
	}
	out, errs := make([]store.Acquisition, len(reqs)), make([]error, len(reqs))
	s.writeMany(ctx, calls, out, errs)
	return out, errs
}

// Settle is one settle of SettleMany.
type Settle struct {
	Key    string
	Fence  uint64
	State  store.State // StateCompleted or StateFailed
	Result []byte
}

// SettleMany runs settles as one shared round trip, as the coalescing does.
func (s *Store) SettleMany(ctx context.Context, settles []Settle) []error {
	calls := make([]writeCall, len(settles))
	for i, c := range settles {
		calls[i] = writeCall{key: c.Key, fence: int64(c.Fence), keep: 3_600_000, state: int(c.State), result: c.Result, op: "complete"}
	}
	out, errs := make([]store.Acquisition, len(settles)), make([]error, len(settles))
	s.writeMany(ctx, calls, out, errs)
	return errs
}
