package storetest

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/store"
)

// Bench runs the shared benchmarks on a store from newStore:
//
//   - Lifecycle: acquire a fresh key and complete it (two transitions);
//   - Lifecycle32: the same from 32 goroutines (16 per -cpu), where a
//     coalescing store shares round trips;
//   - Replay: acquire a completed key (one transition, the duplicate path);
//   - HotKey: every goroutine acquires the same in-flight key (contention).
//
// Each runs with b.RunParallel, so -cpu sets the concurrency.
func Bench(b *testing.B, newStore NewStore) {
	b.Run("Lifecycle", func(b *testing.B) { BenchLifecycle(b, newStore, 1) })
	b.Run("Lifecycle32", func(b *testing.B) { BenchLifecycle(b, newStore, 16) })
	b.Run("Replay", func(b *testing.B) {
		s := newStore(b)
		ctx := context.Background()
		const keys = 1024
		names := make([]string, keys)
		for i := range names {
			names[i] = "replay-" + strconv.Itoa(i)
			a, err := s.Acquire(ctx, store.AcquireRequest{Key: names[i], Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, names[i], a.Fence, []byte(`{"ok":true}`), time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		var seq atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := names[seq.Add(1)%keys]
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
				if err != nil || a.Outcome != store.Replayed {
					b.Fatalf("replay: %v %v", a.Outcome, err)
				}
			}
		})
	})
	b.Run("HotKey", func(b *testing.B) {
		s := newStore(b)
		ctx := context.Background()
		if _, err := s.Acquire(ctx, store.AcquireRequest{Key: "hot", Fingerprint: "fp", Lease: time.Hour, Retention: time.Hour}); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: "hot", Fingerprint: "fp", Lease: time.Hour, Retention: time.Hour})
				if err != nil || a.Outcome != store.InProgress {
					b.Fatalf("hot key: %v %v", a.Outcome, err)
				}
			}
		})
	})
}

// BenchLifecycle runs lifecycles (acquire a fresh key, complete it) from
// parallelism goroutines per -cpu, and reports lifecycles/s.
func BenchLifecycle(b *testing.B, newStore NewStore, parallelism int) {
	s := newStore(b)
	var seq atomic.Uint64
	result := []byte(`{"ok":true}`)
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		buf := make([]byte, 0, 32)
		for pb.Next() {
			buf = strconv.AppendUint(append(buf[:0], "life-"...), seq.Add(1), 10)
			key := string(buf)
			a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil || a.Outcome != store.Acquired {
				b.Fatalf("acquire: %v %v", a.Outcome, err)
			}
			if err := s.Complete(ctx, key, a.Fence, result, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lifecycles/s")
}
