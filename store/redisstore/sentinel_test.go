package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
)

// TestSentinel runs on a real Redis master with a replica and three
// Sentinels, through go-redis's FailoverClient: the conformance suite, the
// WAIT knob, and failovers — the master killed with SIGKILL mid-run.
func TestSentinel(t *testing.T) {
	sentinel := testenv.StartRedisSentinel(t)
	open := func(t testing.TB, cfg redisstore.Config) *redisstore.Store {
		cfg.Client, cfg.Prefix = sentinel.Client(t), testenv.RandomName("idemtest:")+":"
		s, err := redisstore.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, ListsRecords: true, SelfExpiring: true}, func(t testing.TB) store.Store { return open(t, redisstore.Config{}) })
	})
	t.Run("WaitReplicas", func(t *testing.T) {
		ctx := context.Background()
		one := open(t, redisstore.Config{WaitReplicas: 1})
		a, err := one.Acquire(ctx, store.AcquireRequest{Key: "w", Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := one.Complete(ctx, "w", a.Fence, []byte("r"), time.Hour); err != nil {
			t.Fatal(err)
		}
		// Three replicas asked, two exist: a shortfall, failing closed.
		three := open(t, redisstore.Config{WaitReplicas: 3, WaitTimeout: 50 * time.Millisecond})
		_, err = three.Acquire(ctx, store.AcquireRequest{Key: "w2", Lease: time.Minute, Retention: time.Hour})
		if !errors.Is(err, redisstore.ErrReplicationShortfall) || !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("WAIT for 3 replicas of 2: %v, want ErrReplicationShortfall", err)
		}
		// The same through coalesced batches (one batch script and its
		// WAIT in one round trip): every call of a batch that fell short
		// fails closed, every call of a batch that was replicated succeeds.
		for _, c := range []struct {
			s    *redisstore.Store
			want error
		}{{one, nil}, {three, redisstore.ErrReplicationShortfall}} {
			errs := make(chan error, 64)
			var wg sync.WaitGroup
			for i := range 64 {
				wg.Go(func() {
					_, err := c.s.Acquire(ctx, store.AcquireRequest{Key: fmt.Sprintf("b%d", i), Lease: time.Minute, Retention: time.Hour})
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if !errors.Is(err, c.want) {
					t.Fatalf("a batched acquire with WAIT: %v, want %v", err, c.want)
				}
			}
			if trips, calls := c.s.CoalesceStats(); trips == 0 || calls < 2*trips {
				t.Fatalf("64 acquires at once made %d shared trips carrying %d calls", trips, calls)
			}
		}
	})
	for _, wait := range []int{0, 1} {
		t.Run(fmt.Sprintf("FailoverWait%d", wait), func(t *testing.T) {
			s := testenv.StartRedisSentinel(t)
			failover(t, s.Client(t), wait, func(*redisstore.Store, *idem.Guard) (func(), func()) {
				lag := func() {
					for _, r := range s.Replicas {
						s.Node(t, r).Pause(t)
					}
					cutReplicas(t, s.Master)
				}
				kill := func() {
					s.Node(t, s.Master).Kill(t)
					for _, r := range s.Replicas {
						s.Node(t, r).Resume(t)
					}
				}
				return lag, kill
			})
		})
	}
}

// cutReplicas closes the master's replication links (CLIENT KILL TYPE
// replica): with the replicas paused, what the master writes next reaches
// none of them.
func cutReplicas(t *testing.T, master string) {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: master})
	defer rc.Close()
	if err := rc.ClientKillByFilter(context.Background(), "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
}

// failover runs 1,000 lifecycles; then the replicas of the master about to
// die fall behind (SIGSTOP, their links cut) for 50 more; then that master is killed with
// SIGKILL and the replicas continue (one is promoted, behind). It runs on
// until 300 lifecycles in a row succeed, and reports: calls failed closed
// (each with ErrStoreUnavailable: no work ran without a claim), the time
// from the kill to the start of that run of successes, acknowledged
// completions lost, and lifecycles/s before the lag. With WAIT, the
// lifecycles during the lag are refused (not acknowledged), so nothing
// acknowledged is lost; without it, those acknowledged on the lagging
// master are.
func failover(t *testing.T, client redis.UniversalClient, waitReplicas int,
	plan func(s *redisstore.Store, g *idem.Guard) (lag, kill func())) {
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: testenv.RandomName("idemtest:") + ":",
		WaitReplicas: waitReplicas, WaitTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var done []string // completions acknowledged to the caller
	runs := map[string]int{}
	failures := 0
	lifecycle := func(i int) error {
		id := fmt.Sprintf("pay-%05d", i)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := g.Run(cctx, idem.Key{Scope: "failover", ID: id}, nil, func(context.Context, uint64) ([]byte, error) {
			runs[id]++
			return []byte("ok"), nil
		})
		if err == nil {
			done = append(done, id)
			return nil
		}
		failures++
		if !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a failure that is not 'unavailable': %v", err)
		}
		return err
	}
	lag, kill := plan(s, g)
	const before, lagging = 1000, 50
	start := time.Now()
	for i := range before {
		// Before the lag every replica is up; on a loaded machine a WAIT
		// may still miss its 100 ms now and then, and the call fails closed
		// (ErrReplicationShortfall, checked by lifecycle) — more than a few
		// would mean the replicas are not keeping up at all.
		if err := lifecycle(i); err != nil && failures > 10 {
			t.Fatalf("%d lifecycles failed before the lag, the last: %v", failures, err)
		}
	}
	warmup := failures
	rate := float64(before) / time.Since(start).Seconds()
	lag()
	for i := before; i < before+lagging; i++ {
		_ = lifecycle(i)
	}
	refused := failures - warmup
	failures -= warmup
	kill()
	killed := time.Now()
	var after int
	var recovered time.Duration
	for i := before + lagging; after < 300; i++ {
		if err := lifecycle(i); err != nil {
			after = 0                                // recovered means 300 in a row
			if time.Since(killed) > 20*time.Second { // a promotion takes seconds here (node timeout 1s)
				t.Fatalf("no recovery 20s after the master was killed (%d failures)", failures)
			}
			continue
		}
		if after == 0 {
			recovered = time.Since(killed)
		}
		after++
	}
	for id, n := range runs {
		if n > 1 {
			t.Fatalf("%s ran %d times", id, n)
		}
	}
	lost := 0
	for _, id := range done {
		if _, err := s.Get(ctx, g.StorageKey(idem.Key{Scope: "failover", ID: id})); errors.Is(err, store.ErrNotFound) {
			lost++
		}
	}
	if waitReplicas > 0 && lost > 0 {
		t.Errorf("with WAIT %d, %d acknowledged completions were lost in the failover", waitReplicas, lost)
	}
	if waitReplicas == 0 && lost == 0 {
		t.Errorf("without WAIT nothing was lost: the replicas did not fall behind, the test shows nothing")
	}
	t.Logf("failover (WAIT %d): %d of %d lifecycles refused while the replicas lagged (%d before); after the SIGKILL %d calls failed closed, recovered in %v; %d of %d acknowledged completions lost; %.0f lifecycles/s before the lag",
		waitReplicas, refused, lagging, warmup, failures-refused, recovered.Round(time.Millisecond), lost, len(done), rate)
}

// TestSentinelCampaign runs the fault campaign through Sentinel
// (FailoverClient) on a master with two replicas.
func TestSentinelCampaign(t *testing.T) { sentinelCampaign(t, "TestSentinelCampaign", 0) }

// TestSentinelCampaignWaitReplicas: the campaign with WAIT for both
// replicas, and failovers among its faults — SENTINEL FAILOVER while the
// master still takes writes, and the master killed with SIGKILL — in
// which nothing acknowledged may be lost (TestSentinelManualFailover).
func TestSentinelCampaignWaitReplicas(t *testing.T) {
	sentinelCampaign(t, "TestSentinelCampaignWaitReplicas", 2)
}

func sentinelCampaign(t *testing.T, name string, waitReplicas int) {
	cfg := storetest.CampaignConfig{TestName: name, Processes: 2,
		Open: func(t testing.TB, location string) store.Store {
			f := strings.Fields(location)
			c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: f[1], SentinelAddrs: strings.Split(f[2], ","), MaxRetries: -1})
			s, err := redisstore.New(redisstore.Config{Client: c, Prefix: f[0], CloseClient: true, WaitReplicas: waitReplicas})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}}
	if !storetest.IsChild() {
		s := testenv.StartRedisSentinel(t)
		cfg.Location = testenv.RandomName("idemtest:") + ": " + s.MasterName + " " + strings.Join(s.SentinelAddrs, ",")
		if waitReplicas == len(s.Replicas) {
			cfg.Move = func() { s.Failover(t) }
			cfg.Crash = func() { s.CrashMaster(t) }
		}
	}
	storetest.Campaign(t, cfg)
}
