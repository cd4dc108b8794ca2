package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
)

// TestRecordBytes reports what one completed record costs in PostgreSQL (the
// heap tuple, pg_column_size of the row, plus its primary-key index entry)
// with raw and compact keys.
func TestRecordBytes(t *testing.T) {
	s := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
	ctx := context.Background()
	result := []byte(`{"status":201,"id":"B-0001"}`)
	keys := map[string]idem.Key{
		"uuid id":     {Scope: "POST /bookings", ID: "0f8fad5b-d9cb-469f-a165-70867728950e"},
		"200-byte id": {Scope: "POST /bookings", ID: strings.Repeat("x", 200)},
	}
	for name, k := range keys {
		var sizes [2]int64
		for i, compact := range []bool{false, true} {
			sk := k.Storage(compact)
			a, err := s.Acquire(ctx, idem.AcquireRequest{Key: sk, Fingerprint: idem.Fingerprint(result), Lease: time.Minute, Retention: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, sk, a.Fence, result, time.Hour); err != nil {
				t.Fatal(err)
			}
			// Row plus an index entry (8-byte header + the key, aligned).
			err = s.Pool().QueryRow(ctx, `SELECT pg_column_size(r.*) + 8 + ((pg_column_size(r.k) + 7) / 8) * 8 FROM `+s.Table()+` r WHERE k = $1`, sk).Scan(&sizes[i])
			if err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("PostgreSQL, %s, %d-byte result: %d bytes raw, %d bytes compact (row + key index entry)", name, len(result), sizes[0], sizes[1])
		if name == "200-byte id" && sizes[1] >= sizes[0] {
			t.Errorf("compact key does not save space: %d >= %d", sizes[1], sizes[0])
		}
	}
}
