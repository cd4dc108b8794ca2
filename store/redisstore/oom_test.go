package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
)

// TestFullServer: a Redis over its maxmemory (noeviction) refuses new
// claims, closed — no work starts without one — but takes the heartbeats,
// settles and releases of the claims it already holds, so work that was
// running when memory ran out is recorded and not run a second time: a
// key per record and buckets, alone, coalesced, and in one batch beside
// acquisitions (which the server refuses and the settles must survive).
func TestFullServer(t *testing.T) {
	srv := testenv.StartRedisServer(t, "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	for _, buckets := range []int{0, 1} {
		for _, coalesce := range []bool{true, false} {
			t.Run(fmt.Sprintf("buckets=%d,coalesce=%v", buckets, coalesce), func(t *testing.T) {
				s := testenv.OpenRedisConfig(t, srv.Addr, redisstore.Config{
					Prefix: testenv.RandomName("idemtest:") + ":", Buckets: buckets, NoCoalesce: !coalesce})
				c := s.Client()
				const held = 60
				fences := make([]uint64, held)
				for i := range fences {
					a, err := s.Acquire(ctx, store.AcquireRequest{Key: fmt.Sprint("held-", i), Lease: time.Minute, Retention: time.Hour})
					if err != nil || a.Outcome != store.Acquired {
						t.Fatalf("acquire held-%d: %v, %v", i, a.Outcome, err)
					}
					fences[i] = a.Fence
				}
				// A key completed before: its duplicates are answered from the
				// record, which needs no memory.
				done, err := s.Acquire(ctx, store.AcquireRequest{Key: "done", Lease: time.Minute, Retention: time.Hour})
				if err == nil {
					err = s.Complete(ctx, "done", done.Fence, []byte("done"), time.Hour)
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
					t.Fatal(err)
				}
				defer c.ConfigSet(ctx, "maxmemory", "0")
				refused := func(what string, err error) {
					t.Helper()
					if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
						t.Errorf("%s on a full server: %v, want ErrStoreUnavailable (OOM)", what, err)
					}
				}
				_, err = s.Acquire(ctx, store.AcquireRequest{Key: "new", Lease: time.Minute, Retention: time.Hour})
				refused("a new claim", err)
				if a, err := s.Acquire(ctx, store.AcquireRequest{Key: "done", Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != store.Replayed {
					t.Errorf("a duplicate of a completed key on a full server: %v, %v, want Replayed", a.Outcome, err)
				}
				if err := s.Heartbeat(ctx, "held-0", fences[0], 2*time.Minute); err != nil {
					t.Errorf("heartbeat on a full server: %v", err)
				}
				if err := s.Release(ctx, "held-1", fences[1]); err != nil {
					t.Errorf("release on a full server: %v", err)
				}
				if err := s.Fail(ctx, "held-2", fences[2], []byte("failed"), time.Hour); err != nil {
					t.Errorf("fail on a full server: %v", err)
				}
				// Settles of 3..29 and as many new claims, all at once.
				var wg sync.WaitGroup
				for i := 3; i < 30; i++ {
					wg.Add(2)
					go func() {
						defer wg.Done()
						if err := s.Complete(ctx, fmt.Sprint("held-", i), fences[i], []byte("done"), time.Hour); err != nil {
							t.Errorf("complete held-%d on a full server: %v", i, err)
						}
					}()
					go func() {
						defer wg.Done()
						_, err := s.Acquire(ctx, store.AcquireRequest{Key: fmt.Sprint("new-", i), Lease: time.Minute, Retention: time.Hour})
						refused("a new claim beside settles", err)
					}()
				}
				wg.Wait()
				// One batch: a new claim (refused), a duplicate of "done"
				// (replayed) and a settle of each of 30..59 in turn.
				var keys []string
				var batch []uint64
				for i := 30; i < held; i++ {
					keys, batch = append(keys, fmt.Sprint("batched-new-", i), "done", fmt.Sprint("held-", i)), append(batch, 0, 0, fences[i])
				}
				outcomes, errs := s.Batch(ctx, keys, batch, []byte("done"))
				for i, err := range errs {
					if keys[i] == "done" {
						if err != nil || outcomes[i] != store.Replayed {
							t.Errorf("a duplicate of a completed key in a batch on a full server: %v, %v, want Replayed", outcomes[i], err)
						}
					} else if batch[i] == 0 {
						if err == nil || !strings.HasPrefix(err.Error(), "OOM ") {
							t.Errorf("a new claim in a batch on a full server: %v, want OOM", err)
						}
					} else if err != nil {
						t.Errorf("complete %s in a batch beside acquisitions, full server: %v", keys[i], err)
					}
				}
				for i := 3; i < held; i++ {
					rec, err := s.Get(ctx, fmt.Sprint("held-", i))
					if err != nil || rec.State != store.StateCompleted || string(rec.Result) != "done" {
						t.Errorf("held-%d after its settle: %v %q, %v", i, rec.State, rec.Result, err)
					}
				}
				for _, key := range append(keys, "new", "new-3") {
					if strings.HasPrefix(key, "held-") || key == "done" {
						continue
					}
					if _, err := s.Get(ctx, key); !errors.Is(err, store.ErrNotFound) {
						t.Errorf("%s, refused on a full server, is in the store: %v", key, err)
					}
				}
				if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
					t.Fatal(err)
				}
				if a, err := s.Acquire(ctx, store.AcquireRequest{Key: "new", Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != store.Acquired {
					t.Errorf("a new claim once memory is free: %v, %v", a.Outcome, err)
				}
			})
		}
	}
}

// TestSettlesWhereScriptFlagsAreRefused: a server that refuses the settle
// scripts' flags line (Redis before 7.0 knows none; here a flag Redis does
// not know stands for it) runs every settle without it — the first ones,
// refused, sent again — alone and in batches.
func TestSettlesWhereScriptFlagsAreRefused(t *testing.T) {
	ctx := context.Background()
	for _, buckets := range []int{0, 1} {
		for _, coalesce := range []bool{true, false} {
			t.Run(fmt.Sprintf("buckets=%d,coalesce=%v", buckets, coalesce), func(t *testing.T) {
				s := testenv.OpenRedisConfig(t, "", redisstore.Config{
					Prefix: testenv.RandomName("idemtest:") + ":", Buckets: buckets, NoCoalesce: !coalesce})
				s.UseSettleFlags("#!lua flags=idem-test-unknown-flag\n")
				const n = 40
				var wg sync.WaitGroup
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						key := fmt.Sprint("k-", i)
						a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Lease: time.Minute, Retention: time.Hour})
						if err != nil || a.Outcome != store.Acquired {
							t.Errorf("acquire %s: %v, %v", key, a.Outcome, err)
							return
						}
						if err := s.Heartbeat(ctx, key, a.Fence, time.Minute); err != nil {
							t.Errorf("heartbeat %s: %v", key, err)
						}
						if err := s.Complete(ctx, key, a.Fence, []byte("done"), time.Hour); err != nil {
							t.Errorf("complete %s: %v", key, err)
						}
						if rec, err := s.Get(ctx, key); err != nil || rec.State != store.StateCompleted || string(rec.Result) != "done" {
							t.Errorf("%s after its settle: %v %q, %v", key, rec.State, rec.Result, err)
						}
					}()
				}
				wg.Wait()
				if !s.SettleFlagsRefused() {
					t.Error("the server refused the flags line, and the store did not notice")
				}
			})
		}
	}
}
