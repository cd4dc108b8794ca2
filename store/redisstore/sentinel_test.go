package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
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
		storetest.Run(t, storetest.Capabilities{ListsRecords: true, SelfExpiring: true}, func(t testing.TB) idem.Store { return open(t, redisstore.Config{}) })
	})
	t.Run("WaitReplicas", func(t *testing.T) {
		ctx := context.Background()
		one := open(t, redisstore.Config{WaitReplicas: 1})
		a, err := one.Acquire(ctx, idem.AcquireRequest{Key: "w", Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := one.Complete(ctx, "w", a.Fence, []byte("r"), time.Hour); err != nil {
			t.Fatal(err)
		}
		// Three replicas asked, two exist: a shortfall, failing closed.
		three := open(t, redisstore.Config{WaitReplicas: 3, WaitTimeout: 50 * time.Millisecond})
		_, err = three.Acquire(ctx, idem.AcquireRequest{Key: "w2", Lease: time.Minute, Retention: time.Hour})
		if !errors.Is(err, redisstore.ErrReplicationShortfall) || !errors.Is(err, idem.ErrStoreUnavailable) {
			t.Fatalf("WAIT for 3 replicas of 2: %v, want ErrReplicationShortfall", err)
		}
	})
	for _, wait := range []int{0, 1} {
		t.Run(fmt.Sprintf("FailoverWait%d", wait), func(t *testing.T) {
			s := testenv.StartRedisSentinel(t)
			failover(t, s.Client(t), func(*redisstore.Store, *idem.Guard) { s.KillMaster(t) }, wait)
		})
	}
}

// failover runs 500 lifecycles, kills a master with SIGKILL (a replica is
// promoted), runs on until 300 in a row succeeded, and reports: calls
// failed closed (each with ErrStoreUnavailable: no work ran without a
// claim), the time from the kill to the start of that run of successes,
// acknowledged completions lost, and lifecycles/s before the kill.
func failover(t *testing.T, client redis.UniversalClient, kill func(*redisstore.Store, *idem.Guard), waitReplicas int) {
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: testenv.RandomName("idemtest:") + ":", WaitReplicas: waitReplicas})
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
		}
		return err
	}
	const before = 500
	start := time.Now()
	for i := range before {
		if err := lifecycle(i); err != nil {
			t.Fatal(err)
		}
	}
	rate := float64(before) / time.Since(start).Seconds()
	kill(s, g)
	killed := time.Now()
	var failures, after int
	var recovered time.Duration
	for i := before; after < 300; i++ {
		if err := lifecycle(i); err != nil {
			failures++
			after = 0 // recovered means 300 in a row
			if !errors.Is(err, idem.ErrStoreUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a failure during the failover that is not 'unavailable': %v", err)
			}
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
	// What the promoted replica lost of the acknowledged completions.
	lost := 0
	for _, id := range done {
		if _, err := s.Get(ctx, g.StorageKey(idem.Key{Scope: "failover", ID: id})); errors.Is(err, idem.ErrNotFound) {
			lost++
		}
	}
	if waitReplicas > 0 && lost > 0 {
		t.Errorf("with WAIT %d, %d acknowledged completions were lost in the failover", waitReplicas, lost)
	}
	t.Logf("failover (WAIT %d): %d calls failed closed, recovered %v after the SIGKILL, %d of %d acknowledged completions lost; %.0f lifecycles/s before the kill",
		waitReplicas, failures, recovered.Round(time.Millisecond), lost, len(done), rate)
}

// TestSentinelCampaign runs the fault campaign through Sentinel
// (FailoverClient) on a master with two replicas.
func TestSentinelCampaign(t *testing.T) {
	cfg := storetest.CampaignConfig{TestName: "TestSentinelCampaign", Processes: 2,
		Open: func(t testing.TB, location string) idem.Store {
			f := strings.Fields(location)
			c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: f[1], SentinelAddrs: strings.Split(f[2], ","), MaxRetries: -1})
			s, err := redisstore.New(redisstore.Config{Client: c, Prefix: f[0], CloseClient: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}}
	if !storetest.IsChild() {
		s := testenv.StartRedisSentinel(t)
		cfg.Location = testenv.RandomName("idemtest:") + ": " + s.MasterName + " " + strings.Join(s.SentinelAddrs, ",")
	}
	storetest.Campaign(t, cfg)
}
