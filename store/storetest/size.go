package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// RecordBytes completes a typical record under a UUID id and under a
// 200-byte id, each with a raw and a compact key, logs what measure says one
// record costs in the backend, and checks that the compact key saves space on
// the long id. what names the measure in the log.
func RecordBytes(t *testing.T, s idem.Store, what string, measure func(storageKey string) (int64, error)) {
	ctx := context.Background()
	result := []byte(`{"status":201,"id":"B-0001"}`)
	ids := []struct{ name, id string }{
		{"UUID id", "0f8fad5b-d9cb-469f-a165-70867728950e"},
		{"200-byte id", strings.Repeat("x", 200)},
	}
	for _, c := range ids {
		k := idem.Key{Scope: "POST /bookings", ID: c.id}
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
			if sizes[i], err = measure(sk); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s, %s, %d-byte result: %d bytes raw, %d bytes compact", what, c.name, len(result), sizes[0], sizes[1])
		if c.name == "200-byte id" && sizes[1] >= sizes[0] {
			t.Errorf("compact key does not save space: %d >= %d", sizes[1], sizes[0])
		}
	}
}
