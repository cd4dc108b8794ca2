package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
)

// TestClusterResharding: slots move from master to master (a key at a
// time, as `redis-cli --cluster reshard` moves them) while 16 goroutines
// on two clients — two processes' views of the cluster — claim, complete
// and replay keys of those slots. Nothing may run twice, no acknowledged
// completion may be lost, and once the slots have moved every call must
// get through again at once (a store that keeps sending to the old owner
// fails closed until its client reloads the cluster's map, a minute
// later by default). With a key per record and with buckets, coalesced
// and not, with and without WAIT for a replica.
func TestClusterResharding(t *testing.T) {
	cluster := testenv.StartRedisCluster(t, 3, 1)
	for _, tc := range []struct {
		name                  string
		buckets, waitReplicas int
		noCoalesce            bool
	}{
		{name: "KeyPerRecord"},
		{name: "KeyPerRecordAlone", noCoalesce: true},
		{name: "Buckets", buckets: 1},
		{name: "WaitReplicas", waitReplicas: 1},
		{name: "WaitReplicasAlone", waitReplicas: 1, noCoalesce: true},
		{name: "BucketsWaitReplicas", buckets: 1, waitReplicas: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := func() *redisstore.Store {
				s, err := redisstore.New(redisstore.Config{Client: cluster.Client(t), Prefix: "idemtest:reshard:" + tc.name + ":",
					Buckets: tc.buckets, WaitReplicas: tc.waitReplicas, NoCoalesce: tc.noCoalesce})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			reshardWhileRunning(t, cluster, tc.name, tc.buckets == 0, []*redisstore.Store{open(), open()})
		})
	}
	t.Run("ScanWhileSlotsMove", func(t *testing.T) { scanWhileSlotsMove(t, cluster) })
}

// scanWhileSlotsMove: a Scan walk visits the masters one after another, so
// a record moved from one it has not walked yet to one it has would be
// missed — and a Scanner promises every record live for the whole walk.
// Slots move in the middle of a walk, from the last master to the first
// (already walked): the walk must visit every record or fail (start
// again), never end as if complete without them.
func scanWhileSlotsMove(t *testing.T, cluster *testenv.RedisCluster) {
	ctx := context.Background()
	s, err := redisstore.New(redisstore.Config{Client: cluster.Client(t), Prefix: testenv.RandomName("idemtest:") + ":"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 600
	testenv.CompleteMany(t, s, n, func(i int) string { return "scan-" + strconv.Itoa(i) })
	masters := cluster.Masters(t)
	slices.Sort(masters) // the order of the walk
	first, last := masters[0], masters[len(masters)-1]
	seen := map[string]bool{}
	cursor, moved, walkFailed := "", 0, false
	for page := 0; ; page++ {
		recs, next, err := s.Scan(ctx, cursor, 50)
		if err != nil {
			if moved > 0 && errors.Is(err, store.ErrUnavailable) {
				walkFailed = true
				t.Logf("the walk failed after %d pages, %d records, slots of %d records moved: %v", page, len(seen), moved, err)
				break // start again: nothing was claimed complete
			}
			t.Fatal(err)
		}
		for _, r := range recs {
			seen[r.Key] = true
		}
		if moved == 0 && strings.Contains(next, first+"=-") {
			// The first master walked: the slots of the last one's records
			// (five of them) move there.
			slots := map[int]bool{}
			for i := 0; i < n && len(slots) < 5; i++ {
				slot := redisstore.KeySlot(s.KeyName("scan-" + strconv.Itoa(i)))
				if cluster.SlotOwner(t, slot) == last && !slots[slot] {
					slots[slot] = true
					moved += cluster.MoveSlot(t, slot, first, func() {})
				}
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	// While a slot is moving, a walk cannot tell where its keys are: a
	// page fails.
	slot := redisstore.KeySlot(s.KeyName("scan-0"))
	to := first
	if cluster.SlotOwner(t, slot) == first {
		to = last
	}
	asked := false
	cluster.MoveSlot(t, slot, to, func() {
		if !asked {
			asked = true
			if _, _, err := s.Scan(ctx, "", 50); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "moving") {
				t.Errorf("Scan while slot %d is moving: %v", slot, err)
			}
		}
	})
	if moved == 0 {
		t.Fatal("the walk ended before any slot moved")
	}
	if len(seen) != n && !walkFailed {
		t.Fatalf("the walk ended complete with %d of %d records (the slots of %d moved during it)", len(seen), n, moved)
	}
	// Started again once the slots stay where they are: every record.
	clear(seen)
	for cursor = ""; ; {
		recs, next, err := s.Scan(ctx, cursor, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			seen[r.Key] = true
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if len(seen) != n {
		t.Fatalf("a walk with no slot moving visited %d of %d records", len(seen), n)
	}
}

// reshardWhileRunning moves the slots of keys (four slots, twice
// each) under load: with oneKey (a script touches one key, so the slot's
// owner runs it or names the target with ASK, never TRYAGAIN) no call may
// fail even while the slots move.
func reshardWhileRunning(t *testing.T, cluster *testenv.RedisCluster, name string, oneKey bool, stores []*redisstore.Store) {
	const slots, perSlot = 4, 150
	keys := keysInSlots(stores[0], name, slots, perSlot)
	masters := cluster.Masters(t)
	underLoad(t, stores, keys, "slots moved", oneKey, func(between func()) {
		moves, keysMoved := 0, 0
		for round := range 2 {
			for i := range slots {
				slot := redisstore.KeySlot(stores[0].KeyName(keys[i*perSlot]))
				to := masters[(slices.Index(masters, cluster.SlotOwner(t, slot))+1+round%2)%len(masters)]
				keysMoved += cluster.MoveSlot(t, slot, to, between)
				moves++
			}
		}
		t.Logf("%d slot moves (%d keys moved one at a time)", moves, keysMoved)
	})
}

// underLoad runs lifecycles on keys — 16 goroutines over stores, each
// claiming, completing and replaying — while each step of disturb in turn
// changes the cluster (calling between, which returns once a call has
// ended since, as often as it likes). Nothing may be claimed twice and no
// acknowledged completion lost; every call begun after a step returned
// (and before the next) must succeed, and with noFailures every call begun
// during one too.
func underLoad(t *testing.T, stores []*redisstore.Store, keys []string, what string, noFailures bool, disturb ...func(between func())) {
	underLoadOf(t, stores, keys, what, noFailures, false, disturb...)
}

// underLoadOf is underLoad; with lossy, the keys claimed twice and the
// completions lost are counted and reported, not failed on (a setting
// known to lose them, measured).
func underLoadOf(t *testing.T, stores []*redisstore.Store, keys []string, what string, noFailures, lossy bool, disturb ...func(between func())) {
	ctx := context.Background()

	var (
		mu         sync.Mutex
		claimed    = map[string]int{}  // claims handed out per key
		completed  = map[string]bool{} // completions acknowledged
		ops        atomic.Int64
		failures   atomic.Int64
		moved      atomic.Bool  // the step of disturb returned
		failAfter  atomic.Int64 // failures of calls begun after a step
		shortfalls atomic.Int64
		lastErr    atomic.Value
		progress   = make(chan struct{}, 1)
		stop       = make(chan struct{})
		wg         sync.WaitGroup
	)
	// One key in four has a result too large for a bucket: with buckets
	// too, a slot holds keys of records beside its bucket, and a call meets
	// its keys split between two masters while the slot moves.
	result := func(key string) []byte {
		if key[len(key)-1]%4 == 0 {
			return []byte(key + strings.Repeat(".", 100))
		}
		return []byte("r-" + key)
	}
	lifecycle := func(s *redisstore.Store, key string) error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		a, err := s.Acquire(cctx, store.AcquireRequest{Key: key, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			return err
		}
		switch a.Outcome {
		case store.Acquired:
			mu.Lock()
			claimed[key]++
			mu.Unlock()
			if err := s.Complete(cctx, key, a.Fence, result(key), time.Hour); err != nil {
				return err
			}
			mu.Lock()
			completed[key] = true
			mu.Unlock()
		case store.Replayed:
			if !bytes.Equal(a.Record.Result, result(key)) {
				t.Errorf("%s replayed %q", key, a.Record.Result)
			}
		case store.InProgress:
		default:
			t.Errorf("%s: %v (no lease ran out, nothing was released)", key, a.Outcome)
		}
		return nil
	}
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			s := stores[g%len(stores)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				after := moved.Load()
				err := lifecycle(s, keys[rng.IntN(len(keys))])
				switch {
				case errors.Is(err, redisstore.ErrReplicationShortfall):
					// A WAIT that timed out: the replica's pace, not where
					// the call went (counted, not judged).
					shortfalls.Add(1)
				case err != nil:
					failures.Add(1)
					if after {
						failAfter.Add(1)
					}
					lastErr.Store(err.Error())
				}
				ops.Add(1)
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	// Between two keys moved, at least one call: the calls meet every
	// state of a slot half moved.
	between := func() {
		select {
		case <-progress:
		case <-time.After(10 * time.Second):
			t.Fatal("no call ended in 10s")
		}
	}
	for _, step := range disturb {
		moved.Store(false)
		step(between)
		// Once the cluster stays as it is, every call begun then must get
		// through.
		moved.Store(true)
		for range 200 {
			between()
		}
	}
	opsDuring, failedDuring := ops.Load(), failures.Load()-failAfter.Load()
	close(stop)
	wg.Wait()
	t.Logf("%d calls, %d failed (closed) while %s; the last: %v; %d WAITs fell short", opsDuring, failedDuring, what, lastErr.Load(), shortfalls.Load())
	if noFailures && failedDuring > 0 {
		t.Errorf("%d calls failed while %s (a redirection to follow)", failedDuring, what)
	}
	if n := failAfter.Load(); n > 0 {
		t.Errorf("%d calls failed after, the last: %v", n, lastErr.Load())
	}
	judge := t.Errorf
	if lossy {
		judge = t.Logf
	}
	twice := 0
	for key, n := range claimed {
		if n > 1 {
			twice++
			judge("%s claimed %d times", key, n)
		}
	}
	lost := 0
	for key := range completed {
		r, err := stores[1].Get(ctx, key)
		if err != nil || r.State != store.StateCompleted || !bytes.Equal(r.Result, result(key)) {
			lost++
			t.Logf("%s: %+v %v", key, r, err)
		}
	}
	if lost > 0 || twice > 0 {
		judge("%d of %d acknowledged completions lost, %d keys claimed twice", lost, len(completed), twice)
	}
	if len(completed) == 0 { // slow on a loaded machine (WAIT for every replica), never idle
		t.Errorf("none of %d keys completed", len(keys))
	}
}

// keysInSlots returns perSlot storage keys named name-i in each of n
// slots, slot by slot (found by trying names: the slot is the hash of the
// whole name).
func keysInSlots(s *redisstore.Store, name string, n, perSlot int) []string {
	bySlot := map[int][]string{}
	var order []int
	for i := 0; len(order) < n || len(bySlot[order[n-1]]) < perSlot; i++ {
		key := name + "-" + strconv.Itoa(i)
		slot := redisstore.KeySlot(s.KeyName(key))
		if _, ok := bySlot[slot]; !ok && len(order) < n {
			order = append(order, slot)
			bySlot[slot] = nil
		}
		if ks, ok := bySlot[slot]; ok && len(ks) < perSlot {
			bySlot[slot] = append(ks, key)
		}
	}
	var out []string
	for _, slot := range order {
		out = append(out, bySlot[slot]...)
	}
	return out
}

// TestClusterManualFailover: a replica takes its master's place with
// CLUSTER FAILOVER (an operator's upgrade of the master's machine, a
// rebalance of roles) and the old master takes it back, while 16
// goroutines run lifecycles on keys of that master's slots and others:
// nothing claimed twice, nothing acknowledged lost (a manual failover
// waits until the replica has every write), and once it is done every
// call gets through — with WaitReplicas too, whose calls go to the
// master's own connection and meet the old master answering MOVED.
func TestClusterManualFailover(t *testing.T) {
	cluster := testenv.StartRedisCluster(t, 3, 1)
	for _, wait := range []int{0, 1} {
		name := fmt.Sprintf("Wait%d", wait)
		t.Run(name, func(t *testing.T) {
			open := func() *redisstore.Store {
				s, err := redisstore.New(redisstore.Config{Client: cluster.Client(t), Prefix: "idemtest:failover:" + name + ":", WaitReplicas: wait})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			stores := []*redisstore.Store{open(), open()}
			keys := keysInSlots(stores[0], "failover-"+name, 4, 150)
			master := cluster.SlotOwner(t, redisstore.KeySlot(stores[0].KeyName(keys[0])))
			replica := cluster.ReplicasOf(t, master)[0]
			underLoad(t, stores, keys, "masters changed places", false,
				func(func()) { cluster.ManualFailover(t, replica) }, // over
				func(func()) { cluster.ManualFailover(t, master) })  // and back
		})
	}
}

// TestSentinelManualFailover: SENTINEL FAILOVER (an operator's
// maintenance of the master's machine) while 16 goroutines on two
// Sentinel clients run lifecycles. Sentinel promotes a replica without
// stopping the master first: until it is told to follow the new one, the
// old master still takes writes, and the other replica, still following
// it, acknowledges them — so a WAIT for fewer replicas than the master has
// is satisfied by a replica whose copy the failover then discards (Wait1:
// completions lost and keys claimed twice, reported). With WAIT for every
// replica (Wait2: the promoted one must have had the write) nothing is
// lost or claimed twice; and once the Sentinels name the new master, every
// call gets through.
func TestSentinelManualFailover(t *testing.T) {
	sentinel := testenv.StartRedisSentinel(t)
	for _, wait := range []int{1, 2} {
		name := fmt.Sprintf("Wait%d", wait)
		t.Run(name, func(t *testing.T) {
			open := func() *redisstore.Store {
				s, err := redisstore.New(redisstore.Config{Client: sentinel.Client(t), Prefix: "idemtest:sentinel-failover:" + name + ":", WaitReplicas: wait})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			keys := make([]string, 600)
			for i := range keys {
				keys[i] = "failover-" + strconv.Itoa(i)
			}
			lossy := wait < len(sentinel.Replicas)
			underLoadOf(t, []*redisstore.Store{open(), open()}, keys, "the master changed", false, lossy,
				func(func()) { t.Logf("the new master: %s", sentinel.Failover(t)) })
		})
	}
}
