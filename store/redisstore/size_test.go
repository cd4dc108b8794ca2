package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
)

// TestRecordBytes reports what one completed record costs in Redis (MEMORY
// USAGE of its hash) with raw and compact keys, and checks that compact keys
// save memory on a long key.
func TestRecordBytes(t *testing.T) {
	s := testenv.OpenRedis(t, testenv.RandomName("idemtest:")+":")
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
			n, err := s.Client().MemoryUsage(ctx, s.KeyName(sk)).Result()
			if err != nil {
				t.Fatal(err)
			}
			sizes[i] = n
		}
		t.Logf("Redis, %s, %d-byte result: %d bytes raw, %d bytes compact", name, len(result), sizes[0], sizes[1])
		if name == "200-byte id" && sizes[1] >= sizes[0] {
			t.Errorf("compact key does not save memory: %d >= %d", sizes[1], sizes[0])
		}
	}
}
