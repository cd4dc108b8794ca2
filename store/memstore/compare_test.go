package memstore_test

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// bareMap is the floor the memory store is measured against: a sharded map
// doing one insert and one update per operation, with no lease, fence,
// fingerprint or retention logic.
type bareMap struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.Mutex
		m  map[string]*bareEntry
		_  [40]byte
	}
}

type bareEntry struct {
	state  int
	result []byte
}

func newBareMap() *bareMap {
	b := &bareMap{seed: maphash.MakeSeed()}
	for i := range b.shards {
		b.shards[i].m = make(map[string]*bareEntry)
	}
	return b
}

func (b *bareMap) lifecycle(key string, result []byte) {
	sh := &b.shards[maphash.String(b.seed, key)&63]
	sh.mu.Lock()
	if _, ok := sh.m[key]; !ok {
		sh.m[key] = &bareEntry{state: 1}
	}
	sh.mu.Unlock()
	sh.mu.Lock()
	e := sh.m[key]
	e.state = 2
	e.result = result
	sh.mu.Unlock()
}

// BenchmarkLifecycleVsBareMap measures, in one run, the memory store's
// acquire+complete lifecycle and the bare sharded map's insert+update on the
// same key stream, and reports the ratio (store ns/op over map ns/op; the
// target is at most 2).
func BenchmarkLifecycleVsBareMap(b *testing.B) {
	result := []byte(`{"ok":true}`)
	var storeNs, mapNs float64
	b.Run("memstore", func(b *testing.B) {
		s := memstore.New(memstore.Config{SweepInterval: -1})
		defer s.Close()
		var seq atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			buf := make([]byte, 0, 32)
			for pb.Next() {
				buf = strconv.AppendUint(append(buf[:0], "k-"...), seq.Add(1), 10)
				key := string(buf)
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
				if err != nil || a.Outcome != store.Acquired {
					b.Fatal(a.Outcome, err)
				}
				if err := s.Complete(ctx, key, a.Fence, result, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
		})
		storeNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("baremap", func(b *testing.B) {
		m := newBareMap()
		var seq atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			buf := make([]byte, 0, 32)
			for pb.Next() {
				buf = strconv.AppendUint(append(buf[:0], "k-"...), seq.Add(1), 10)
				m.lifecycle(string(buf), result)
			}
		})
		mapNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	if mapNs > 0 {
		fmt.Printf("LifecycleVsBareMap: memstore %.0f ns/op, bare map %.0f ns/op, ratio %.2f (target ≤ 2)\n", storeNs, mapNs, storeNs/mapNs)
	}
}

// BenchmarkVsWatermillDeduplicator runs the same key stream (every key
// delivered twice) through idem's Guard on the memory store and through
// Watermill's Deduplicator middleware with its map repository, and reports
// the ratio (idem ns/op over Watermill ns/op). Watermill only marks a key
// seen; idem also leases, fences, stores the result and replays it.
func BenchmarkVsWatermillDeduplicator(b *testing.B) {
	const window = time.Hour
	var idemNs, wmNs float64
	b.Run("idem", func(b *testing.B) {
		s := memstore.New(memstore.Config{SweepInterval: -1})
		defer s.Close()
		g, err := idem.NewGuard(idem.Config{Store: s, Retention: window, HeartbeatInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		var handled atomic.Int64
		work := func(ctx context.Context, fence uint64) ([]byte, error) {
			handled.Add(1)
			return nil, nil
		}
		ctx := context.Background()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			key := idem.Key{Scope: "orders", ID: strconv.Itoa(i / 2)}
			if _, err := g.Run(ctx, key, nil, work); err != nil {
				b.Fatal(err)
			}
			i++
		}
		if want := int64((i + 1) / 2); handled.Load() != want {
			b.Fatalf("idem handled %d, want %d", handled.Load(), want)
		}
		idemNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("watermill", func(b *testing.B) {
		repo, err := middleware.NewMapExpiringKeyRepository(window)
		if err != nil {
			b.Fatal(err)
		}
		d := &middleware.Deduplicator{
			KeyFactory: func(m *message.Message) (string, error) { return m.Metadata.Get("key"), nil },
			Repository: repo,
		}
		var handled atomic.Int64
		h := d.Middleware(func(m *message.Message) ([]*message.Message, error) {
			handled.Add(1)
			return nil, nil
		})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			m := message.NewMessage("msg", nil)
			m.Metadata.Set("key", "orders/"+strconv.Itoa(i/2))
			if _, err := h(m); err != nil {
				b.Fatal(err)
			}
			i++
		}
		if want := int64((i + 1) / 2); handled.Load() != want {
			b.Fatalf("watermill handled %d, want %d", handled.Load(), want)
		}
		wmNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	if wmNs > 0 {
		fmt.Printf("VsWatermillDeduplicator: idem %.0f ns/op, watermill %.0f ns/op, ratio %.2f (idem/watermill)\n", idemNs, wmNs, idemNs/wmNs)
	}
}
