package storetest

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/race"
	"github.com/idemgo/idem/store"
)

// RecordBytes completes a typical record under a UUID id and under a
// 200-byte id, each with a raw and a compact key, logs what measure says one
// record costs in the backend, and checks that the compact key saves space on
// the long id. what names the measure in the log.
func RecordBytes(t *testing.T, s store.Store, what string, measure func(storageKey string) (int64, error)) {
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
			a, err := s.Acquire(ctx, store.AcquireRequest{Key: sk, Fingerprint: idem.Fingerprint(result), Lease: time.Minute, Retention: time.Hour})
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

var recordsForBytes = flag.Int("recordbytes.n", 20000, "how many completed records MemoryPerRecord writes for each key kind")

// RecordsForBytes is -recordbytes.n: how many records MemoryPerRecord
// writes of each key kind.
func RecordsForBytes() int { return *recordsForBytes }

// MemoryPerRecord writes -recordbytes.n completed records (default 20,000;
// the figure is at 1,000,000) with raw UUID keys, then as many with
// compact keys, each with a 28-byte result, and logs what the backend's
// memory or size grew by per record (used reads it: Redis used_memory, a
// table's total relation size) and the projection to a billion records.
func MemoryPerRecord(t *testing.T, s store.Store, what string, used func() (int64, error)) {
	for _, compact := range []bool{false, true} {
		MemoryPerRecordOf(t, s, compact, what, used)
	}
}

// MemoryPerRecordOf is MemoryPerRecord for one kind of key: compact or raw
// UUID keys.
func MemoryPerRecordOf(t *testing.T, s store.Store, compact bool, what string, used func() (int64, error)) {
	if testing.Short() {
		t.Skip("-short: a measurement of the store's growth over many records")
	}
	if race.Enabled {
		t.Skip("a measurement of the store's growth, slowed past use by -race; .ci/run runs it without")
	}
	ctx := context.Background()
	n := *recordsForBytes
	result := []byte(`{"status":201,"id":"B-0001"}`)
	fp := idem.Fingerprint(result)
	before, err := used()
	if err != nil {
		t.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				k := idem.Key{Scope: "POST /bookings", ID: fmt.Sprintf("%08x-d9cb-469f-a165-%012x", i, i)}.Storage(compact)
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
				if err == nil {
					err = s.Complete(ctx, k, a.Fence, result, time.Hour)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	after, err := used()
	if err != nil {
		t.Fatal(err)
	}
	per := float64(after-before) / float64(n)
	kind := "raw UUID keys"
	if compact {
		kind = "compact keys"
	}
	t.Logf("%s, %d completed records, %s, 28-byte result: %.1f bytes per record; 1,000,000,000 records: %.0f GB",
		what, n, kind, per, per) // bytes per record × 10^9 records / 10^9 bytes per GB
}
