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
