// Package sqlrecord reads the idempotency records of the SQL stores that
// keep them as packed keys and fingerprints (internal/keypack) and Unix
// milliseconds (sqlitestore, mysqlstore).
package sqlrecord

import (
	"time"

	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/store"
)

// Columns are the columns Scan reads, in its order.
const Columns = `k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at`

// Scanner is a row: *sql.Row or *sql.Rows.
type Scanner interface{ Scan(dest ...any) error }

// Scan reads a record of Columns, after the extra destinations (an
// acquisition's outcome, say) that come first in the row.
func Scan(sc Scanner, extra ...any) (store.Record, error) {
	var r store.Record
	var key, fp []byte
	var state int
	var lease, exp, upd int64
	dest := append(extra, &key, &state, &r.Fence, &fp, &r.Attempts, &r.Result, &lease, &exp, &upd)
	if err := sc.Scan(dest...); err != nil {
		return store.Record{}, err
	}
	r.Key, r.Fingerprint = keypack.Key(string(key)), keypack.UnpackFingerprint(string(fp))
	r.State = store.State(state)
	if r.State == store.StateInFlight {
		r.LeaseUntil = Time(lease)
	}
	r.ExpiresAt, r.UpdatedAt = Time(exp), Time(upd)
	return r, nil
}

// Time is the point in time of Unix milliseconds ms; 0 is the zero time.
func Time(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
