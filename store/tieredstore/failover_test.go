package tieredstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/tieredstore"
)

// TestFailoverOfAWaitingHotTier: the hot tier is a Redis master with two
// replicas under Sentinel, its writes waiting for both replicas
// (redisstore's WaitReplicas), and the master is killed twice under load,
// a replica promoted each time. A failover that loses no acknowledged write
// keeps every guarantee of the tiered store (internal/model's tiered.pml,
// FAILOVER WAITED): no claim is handed out while another stands, no work
// runs again once its Complete returned nil, and every completed key is
// replayed its result afterwards.
func TestFailoverOfAWaitingHotTier(t *testing.T) {
	sentinel := testenv.StartRedisSentinel(t)
	hot, err := redisstore.New(redisstore.Config{Client: sentinel.Client(t), Prefix: testenv.RandomName("idemtest:tiered-failover:") + ":",
		WaitReplicas: len(sentinel.Replicas)})
	if err != nil {
		t.Fatal(err)
	}
	cold := memstore.New(memstore.Config{SweepInterval: -1})
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, HotRetention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	ctx := context.Background()
	result := func(key string) []byte { return []byte("r-" + key) }
	var (
		mu        sync.Mutex
		holder    = map[string]bool{} // keys whose claim is handed out and not settled
		completed = map[string]bool{} // keys whose Complete returned nil
		runs      int
		failed    int
		progress  = make(chan struct{}, 1)
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	lifecycle := func(key string) error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		a, err := s.Acquire(cctx, store.AcquireRequest{Key: key, Lease: 20 * time.Second, Retention: time.Hour})
		if err != nil {
			return err
		}
		switch a.Outcome {
		case store.Replayed:
			if !bytes.Equal(a.Record.Result, result(key)) {
				t.Errorf("%s replayed %q", key, a.Record.Result)
			}
			return nil
		case store.InProgress:
			return nil
		case store.Acquired, store.TakenOver:
		default:
			t.Errorf("%s: %v", key, a.Outcome)
			return nil
		}
		mu.Lock()
		if completed[key] {
			t.Errorf("%s handed out (fence %d) after its Complete returned nil", key, a.Fence)
		}
		if holder[key] {
			t.Errorf("%s handed out (fence %d) beside another claim", key, a.Fence)
		}
		holder[key] = true
		runs++
		mu.Unlock()
		// As the Guard does: a settle that could not reach the store goes
		// again while the claim lasts.
		for {
			err = s.Complete(cctx, key, a.Fence, result(key), time.Hour)
			if err == nil || cctx.Err() != nil || !errors.Is(err, store.ErrUnavailable) {
				break
			}
		}
		mu.Lock()
		delete(holder, key)
		if err == nil {
			completed[key] = true
		}
		mu.Unlock()
		return err
	}
	// Half the calls take a new key, half a duplicate of one of the last
	// 64: claims are in flight and settles under way when the master dies.
	var newest atomic.Int64
	pick := func(rng *rand.Rand) string {
		n := newest.Load()
		if rng.IntN(2) == 0 || n < 64 {
			n = newest.Add(1)
		} else {
			n -= rng.Int64N(64)
		}
		return fmt.Sprintf("failover-%d", n)
	}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := lifecycle(pick(rng)); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					select { // the store fails closed while the master is away: back off
					case <-stop:
					case <-time.After(20 * time.Millisecond):
					}
					continue
				}
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	calls := func(n int) { // n calls that got through
		for range n {
			select {
			case <-progress:
			case <-time.After(30 * time.Second):
				t.Fatal("no call ended in 30s")
			}
		}
	}
	calls(500)
	for range 2 {
		sentinel.CrashMaster(t)
		calls(500)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d runs, %d completed, %d calls failed (closed)", runs, len(completed), failed)
	if len(completed) == 0 {
		t.Fatal("nothing completed")
	}
	for key := range completed {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Lease: time.Second, Retention: time.Hour})
		if err != nil || a.Outcome != store.Replayed || !bytes.Equal(a.Record.Result, result(key)) {
			t.Errorf("%s after the failovers: %v %q %v, want its result replayed", key, a.Outcome, a.Record.Result, err)
		}
	}
}
