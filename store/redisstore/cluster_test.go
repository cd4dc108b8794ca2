package redisstore_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
	"github.com/idemgo/idem/store/storeurl"
)

// TestCluster runs on a real Redis Cluster of 3 masters and 3 replicas
// (redis-server processes on loopback): the conformance suite, and List
// over many records spread on every master.
func TestCluster(t *testing.T) {
	cluster := testenv.StartRedisCluster(t, 3, 1)
	open := func(t testing.TB) *redisstore.Store {
		s, err := redisstore.New(redisstore.Config{Client: cluster.Client(t), Prefix: testenv.RandomName("idemtest:") + ":"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, ListsRecords: true, SelfExpiring: true}, func(t testing.TB) store.Store { return open(t) })
	})
	t.Run("ConformanceBuckets", func(t *testing.T) {
		// A record's own key and its bucket share a slot (else every
		// script would fail with CROSSSLOT); with WaitReplicas, the
		// pipelines per master carry two keys per call.
		for _, wait := range []int{0, 1} {
			storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, ListsRecords: true, SelfExpiring: true}, func(t testing.TB) store.Store {
				s, err := redisstore.New(redisstore.Config{Client: cluster.Client(t), Prefix: testenv.RandomName("idemtest:") + ":", Buckets: 1, WaitReplicas: wait})
				if err != nil {
					t.Fatal(err)
				}
				return s
			})
		}
	})
	t.Run("ConformanceWaitingForAReplica", func(t *testing.T) {
		// Coalesced pipelines on a Cluster with WaitReplicas: one per master,
		// each ending with its WAIT.
		storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, ListsRecords: true, SelfExpiring: true}, func(t testing.TB) store.Store {
			s, err := redisstore.New(redisstore.Config{Client: cluster.Client(t), Prefix: testenv.RandomName("idemtest:") + ":", WaitReplicas: 1})
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
		s, err := redisstore.New(redisstore.Config{Client: cluster.Client(t), Prefix: testenv.RandomName("idemtest:") + ":", WaitReplicas: 1})
		if err != nil {
			t.Fatal(err)
		}
		testenv.CompleteMany(t, s, 16*40, func(i int) string { return fmt.Sprintf("w-%d", i) })
		if trips, calls := s.CoalesceStats(); trips == 0 || calls < 2*trips {
			t.Fatalf("16 goroutines on the cluster shared %d pipelines carrying %d calls", trips, calls)
		}
	})
	t.Run("OpensWithADeadSeed", func(t *testing.T) {
		// The first seed is a port nothing listens on (a node that is
		// down); the others let the client find the cluster.
		dead := "127.0.0.1:1"
		url := "redis://" + dead + "?idem_cluster=1&idem_prefix=" + testenv.RandomName("idemtest:") + ":"
		for _, a := range cluster.Addrs[1:] {
			url += "&addr=" + a
		}
		s, err := storeurl.Open(context.Background(), url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Acquire(context.Background(), store.AcquireRequest{Key: "k", Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("WaitCost", func(t *testing.T) {
		// Lifecycles per second, one caller, without and with WAIT for one
		// replica (each transition waits for its master's replica).
		var rates [2]float64
		for wait := range 2 {
			s, err := redisstore.New(redisstore.Config{Client: cluster.Client(t), Prefix: testenv.RandomName("idemtest:") + ":", WaitReplicas: wait})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			start := time.Now()
			for i := range 500 {
				k := fmt.Sprintf("w-%d", i)
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
				if err == nil {
					err = s.Complete(ctx, k, a.Fence, []byte("r"), time.Hour)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			rates[wait] = 500 / time.Since(start).Seconds()
		}
		t.Logf("one caller on the cluster: %.0f lifecycles/s without WAIT, %.0f with WAIT 1 (%.2fx)", rates[0], rates[1], rates[1]/rates[0])
	})
	t.Run("ScanVisitsEveryRecord", func(t *testing.T) {
		s := open(t)
		fill(t, s, *clusterRecords)
		seen, dups := map[string]int{}, 0
		cursor, pages := "", 0
		for {
			recs, next, err := s.Scan(context.Background(), cursor, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if seen[r.Key]++; seen[r.Key] > 1 {
					dups++
				}
			}
			pages++
			if next == "" {
				break
			}
			cursor = next
		}
		if len(seen) != *clusterRecords {
			t.Fatalf("Scan visited %d of %d records", len(seen), *clusterRecords)
		}
		t.Logf("Scan: %d records in %d pages, %d met twice", len(seen), pages, dups)
	})
	t.Run("ListVisitsEveryRecordOnce", func(t *testing.T) {
		const n = 20_000
		s := open(t)
		ctx := context.Background()
		fill(t, s, n)
		seen := map[string]int{}
		after := ""
		for {
			page, err := s.List(ctx, after, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			for _, r := range page {
				seen[r.Key]++
			}
			after = page[len(page)-1].Key
		}
		if len(seen) != n {
			t.Fatalf("List visited %d of %d records", len(seen), n)
		}
		for k, c := range seen {
			if c != 1 {
				t.Fatalf("List visited %s %d times", k, c)
			}
		}
	})
	t.Run("BucketSlotsAreRedis", func(t *testing.T) {
		// Each slot's tag, and each bucket and record name, is in the slot
		// Redis itself computes (CLUSTER KEYSLOT, one pipeline).
		c := cluster.Client(t)
		ctx := context.Background()
		s, err := redisstore.New(redisstore.Config{Client: c, Prefix: testenv.RandomName("idemtest:") + ":", Buckets: 1})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for slot := range 16384 {
			names = append(names, redisstore.SlotTag(slot))
		}
		for _, k := range bucketSlotKeys {
			keys, _ := s.Locate(k)
			names = append(names, keys...)
		}
		cmds := make([]*redis.IntCmd, len(names))
		pipe := c.Pipeline()
		for i, n := range names {
			cmds[i] = pipe.ClusterKeySlot(ctx, n)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for i, n := range names {
			if got := redisstore.KeySlot(n); int64(got) != cmds[i].Val() {
				t.Fatalf("%q: slot %d here, %d for Redis", n, got, cmds[i].Val())
			}
		}
	})
	t.Run("BucketsScanAndListVisitEveryRecord", func(t *testing.T) {
		// Records in buckets on every master, and some too long for a
		// bucket in keys of their own: Scan visits each at least once,
		// List each once.
		s, err := redisstore.New(redisstore.Config{Client: cluster.Client(t), Prefix: testenv.RandomName("idemtest:") + ":", Buckets: 1})
		if err != nil {
			t.Fatal(err)
		}
		// Each master's settings are read (the test cluster keeps Redis's
		// default hash-max-listpack-value, 64, and no persistence, and
		// gives each master a replica, which the store does not WAIT for).
		w, err := s.ServerWarnings(context.Background())
		listpack, replica := 0, 0
		for _, x := range w {
			if strings.Contains(x, "hash-max-listpack-value is 64") {
				listpack++
			}
			if strings.Contains(x, "1 replica(s) and Config.WaitReplicas 0") {
				replica++
			}
		}
		if err != nil || listpack != 3 || replica != 3 || len(w) != 9 {
			t.Fatalf("ServerWarnings on 3 masters: %q, %v", w, err)
		}
		const n, long = 20_000, 200
		fill(t, s, n)
		testenv.CompleteMany(t, s, long, func(i int) string { return fmt.Sprintf("%064d", i) })
		ctx := context.Background()
		scanned := map[string]bool{}
		for cursor := ""; ; {
			recs, next, err := s.Scan(ctx, cursor, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) > 3000 { // about the limit: a SCAN batch of buckets may hold more than 1,000
				t.Fatalf("a Scan page of %d records, limit 1,000", len(recs))
			}
			for _, r := range recs {
				if r.State != store.StateCompleted {
					t.Fatalf("Scan: %+v", r)
				}
				scanned[r.Key] = true
			}
			if cursor = next; cursor == "" {
				break
			}
		}
		listed := map[string]int{}
		for after := ""; ; {
			page, err := s.List(ctx, after, 5000)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			for _, r := range page {
				listed[r.Key]++
			}
			after = page[len(page)-1].Key
		}
		if len(scanned) != n+long || len(listed) != n+long {
			t.Fatalf("Scan visited %d, List %d of %d records", len(scanned), len(listed), n+long)
		}
		for k, c := range listed {
			if c != 1 {
				t.Fatalf("List visited %q %d times", k, c)
			}
		}
	})
	// Last: it kills a master for good.
	t.Run("FailoverFailsClosedThenResumes", func(t *testing.T) {
		failover(t, cluster.Client(t), 0, clusterPlan(t, cluster))
	})
}

// clusterRecords is how many records the cluster's Scan test writes
// (about 20 s under -race on this 2-core machine).
var clusterRecords = flag.Int("cluster.records", 200_000, "records written for the cluster's scan test")

// fill completes n records rec-000000… in s, with 16 writers.
func fill(t *testing.T, s *redisstore.Store, n int) {
	testenv.CompleteMany(t, s, n, func(i int) string { return fmt.Sprintf("rec-%06d", i) })
}

// TestClusterCampaign runs the fault campaign on a Redis Cluster of 3
// masters and 3 replicas: worker processes killed with SIGKILL, deletes,
// sweeps, stalled owners, keys on every master, and the slots of the
// campaign's keys moved from master to master while it runs.
func TestClusterCampaign(t *testing.T) { clusterCampaign(t, "TestClusterCampaign", 0, 0) }

// TestClusterCampaignBuckets: the same with records in buckets, whose
// scripts take two keys of one slot (own key, bucket) and meet those keys
// split by a slot's move.
func TestClusterCampaignBuckets(t *testing.T) {
	clusterCampaign(t, "TestClusterCampaignBuckets", 0, 1)
}

// TestClusterCampaignWaitReplicas: the same with WaitReplicas 1, whose
// calls go to their master's own connection (for the WAIT after them)
// and follow the cluster's redirections there themselves — and masters
// killed with SIGKILL, their replicas promoted.
func TestClusterCampaignWaitReplicas(t *testing.T) {
	clusterCampaign(t, "TestClusterCampaignWaitReplicas", 1, 0)
}

func clusterCampaign(t *testing.T, name string, waitReplicas, buckets int) {
	cfg := storetest.CampaignConfig{TestName: name, Processes: 2,
		Open: func(t testing.TB, location string) store.Store {
			prefix, addrs, _ := strings.Cut(location, " ")
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ","), MaxRetries: -1})
			s, err := redisstore.New(redisstore.Config{Client: c, Prefix: prefix, CloseClient: true, WaitReplicas: waitReplicas, Buckets: buckets})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}}
	if !storetest.IsChild() {
		cluster := testenv.StartRedisCluster(t, 3, 1)
		cfg.Location = testenv.RandomName("idemtest:") + ": " + strings.Join(cluster.Addrs, ",")
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
		cfg.Move = func() {
			// The slot of one of the campaign's keys (c0, c1, …: the slot
			// is their name's, whatever the prefix) to another master, a
			// pause at each step.
			masters := cluster.Masters(t)
			slot := redisstore.KeySlot("{c" + strconv.Itoa(rng.IntN(6)) + "}")
			owner := slices.Index(masters, cluster.SlotOwner(t, slot))
			to := masters[(owner+1+rng.IntN(len(masters)-1))%len(masters)]
			cluster.MoveSlot(t, slot, to, func() { time.Sleep(20 * time.Millisecond) })
		}
		if waitReplicas > 0 {
			// WAIT for each master's one replica: a master killed (its
			// replica promoted, and it back, empty, as the replica) loses
			// nothing acknowledged.
			cfg.Crash = func() {
				masters := cluster.Masters(t)
				cluster.CrashMaster(t, masters[rng.IntN(len(masters))])
			}
		}
	}
	storetest.Campaign(t, cfg)
}

// TestClusterFailoverWait: the durability knob on a cluster of 3 masters
// with 2 replicas each (so the promoted replica keeps one): 1,000
// completions, a master killed with SIGKILL right after, and what was
// lost, without and with WAIT for one replica.
func TestClusterFailoverWait(t *testing.T) {
	for _, wait := range []int{0, 1} {
		t.Run(fmt.Sprintf("Wait%d", wait), func(t *testing.T) {
			cluster := testenv.StartRedisCluster(t, 3, 2)
			failover(t, cluster.Client(t), wait, clusterPlan(t, cluster))
		})
	}
}

// clusterPlan: the master of the first lagging key falls behind and dies.
// The master and its replicas are looked up when the lag starts, not
// before the first lifecycles: on a loaded machine a node may miss its
// 1 s node timeout meanwhile and a replica take its place, and the lag
// must hit the master of that moment.
func clusterPlan(t *testing.T, cluster *testenv.RedisCluster) func(*redisstore.Store, *idem.Guard) (func(), func()) {
	return func(s *redisstore.Store, g *idem.Guard) (func(), func()) {
		var master string
		var replicas []string
		lag := func() {
			// The node named master must be one, with its replicas: a
			// client's slot map can name a node that a failover during
			// the first lifecycles made a replica, whose "replicas" are
			// none — and then nothing lags, and the kill loses nothing.
			testenv.Eventually(t, 30*time.Second, "the master of the first lagging key, with replicas", func() error {
				cc := cluster.Client(t) // a new client: the slots as the cluster has them now
				m, err := cc.MasterForKey(context.Background(), s.KeyName(g.StorageKey(idem.Key{Scope: "failover", ID: "pay-01000"})))
				if err != nil {
					return err
				}
				master = m.Options().Addr
				role, err := m.Do(context.Background(), "ROLE").Slice()
				if err != nil {
					return err
				}
				if len(role) == 0 || role[0] != "master" {
					return fmt.Errorf("%s is a %v", master, role)
				}
				if replicas = cluster.ReplicasOf(t, master); len(replicas) == 0 {
					return fmt.Errorf("%s has no replicas", master)
				}
				return nil
			})
			t.Logf("lagging the replicas %v of %s", replicas, master)
			for _, r := range replicas {
				cluster.Node(t, r).Pause(t)
			}
			cutReplicas(t, master)
		}
		kill := func() {
			cluster.Node(t, master).Kill(t)
			for _, r := range replicas {
				cluster.Node(t, r).Resume(t)
			}
		}
		return lag, kill
	}
}
