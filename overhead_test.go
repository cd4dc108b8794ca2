package idem_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// BenchmarkGuardOverhead measures, in one run on the memory store, what the
// Guard adds to the store calls it makes: a first run (Guard.Run against the
// raw Acquire+Complete with the same requests) and a replay (idem.Do, which
// decodes the stored result, against Guard.Run's replay). The heartbeats are
// on, at their defaults. It prints both ratios (targets: lifecycle ≤ 1.3,
// Do replay ≤ 1.5).
//
// The lifecycles cycle through a bounded set of keys, completed with a
// retention of a millisecond: each key's record has expired when its turn
// comes again, and its acquisition takes it as new. So each side's store
// holds a bounded number of records: had the keys been fresh, each side
// grew its store by a million records in a second or two, and the ratio
// measured how often the garbage collector scanned that heap (the side
// allocating a little more met more collections) — 0.84 to 1.70 between
// runs of the same code.
func BenchmarkGuardOverhead(b *testing.B) {
	type payment struct {
		ID     string `json:"id"`
		Amount int64  `json:"amount"`
		Status string `json:"status"`
	}
	result := []byte(`{"id":"PAY-1","amount":100,"status":"captured"}`)
	fp := idem.Fingerprint(result)
	ns := map[string]float64{}
	perOp := func(name string, b *testing.B) { ns[name] = float64(b.Elapsed().Nanoseconds()) / float64(b.N) }
	newStore := func(b *testing.B) *memstore.Store {
		s := memstore.New(memstore.Config{SweepInterval: -1})
		b.Cleanup(func() { s.Close() })
		return s
	}
	const keys, retention = 1 << 16, time.Millisecond
	newGuard := func(b *testing.B, retention time.Duration) *idem.Guard {
		g, err := idem.NewGuard(idem.Config{Store: newStore(b), Retention: retention})
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	var seq atomic.Uint64
	nextKey := func(buf []byte) idem.Key {
		return idem.Key{Scope: "payments", ID: string(strconv.AppendUint(buf[:0], seq.Add(1)%keys, 10))}
	}

	b.Run("raw-lifecycle", func(b *testing.B) {
		s := newStore(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			buf := make([]byte, 0, 24)
			for pb.Next() {
				k := nextKey(buf).Storage(false)
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Fingerprint: fp, Lease: 30 * time.Second, Retention: retention})
				if err != nil || a.Outcome != store.Acquired {
					b.Fatal(a.Outcome, err)
				}
				if err := s.Complete(ctx, k, a.Fence, result, retention); err != nil {
					b.Fatal(err)
				}
			}
		})
		perOp("raw-lifecycle", b)
	})
	b.Run("guard-lifecycle", func(b *testing.B) {
		g := newGuard(b, retention)
		work := func(context.Context, uint64) ([]byte, error) { return result, nil }
		opts := &idem.RunOptions{Fingerprint: fp}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			buf := make([]byte, 0, 24)
			for pb.Next() {
				res, err := g.Run(ctx, nextKey(buf), opts, work)
				if err != nil || res.Outcome != store.Acquired {
					b.Fatal(res.Outcome, err)
				}
			}
		})
		perOp("guard-lifecycle", b)
	})

	// The replays read one completed key again and again.
	replayGuard := func(b *testing.B) (*idem.Guard, idem.Key) {
		g := newGuard(b, 24*time.Hour)
		k := idem.Key{Scope: "payments", ID: "PAY-1"}
		if _, err := g.Run(context.Background(), k, nil, func(context.Context, uint64) ([]byte, error) { return result, nil }); err != nil {
			b.Fatal(err)
		}
		return g, k
	}
	b.Run("guard-replay", func(b *testing.B) {
		g, k := replayGuard(b)
		work := func(context.Context, uint64) ([]byte, error) { b.Fatal("ran twice"); return nil, nil }
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				res, err := g.Run(ctx, k, nil, work)
				if err != nil || res.Outcome != store.Replayed || len(res.Value) == 0 {
					b.Fatal(res.Outcome, err)
				}
			}
		})
		perOp("guard-replay", b)
	})
	b.Run("do-replay", func(b *testing.B) {
		g, k := replayGuard(b)
		fn := func(context.Context) (payment, error) { b.Fatal("ran twice"); return payment{}, nil }
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				p, err := idem.Do(ctx, g, k, fn)
				if err != nil || p.Amount != 100 {
					b.Fatal(p, err)
				}
			}
		})
		perOp("do-replay", b)
	})
	if ns["raw-lifecycle"] > 0 && ns["guard-replay"] > 0 {
		fmt.Printf("GuardOverhead: Guard.Run lifecycle %.0f ns/op, raw Acquire+Complete %.0f ns/op, ratio %.2f (target ≤ 1.3); "+
			"Do replay %.0f ns/op, Guard.Run replay %.0f ns/op, ratio %.2f (target ≤ 1.5)\n",
			ns["guard-lifecycle"], ns["raw-lifecycle"], ns["guard-lifecycle"]/ns["raw-lifecycle"],
			ns["do-replay"], ns["guard-replay"], ns["do-replay"]/ns["guard-replay"])
	}
}
