package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/storetest"
)

func openAt(t testing.TB, prefix string) idem.Store { return testenv.OpenRedis(t, prefix) }

func newStore(t testing.TB) idem.Store { return openAt(t, testenv.RandomName("idemtest:")+":") }

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{ListsRecords: true, SelfExpiring: true}, newStore)
}

func TestEveryKeyHasTTL(t *testing.T) {
	s := testenv.OpenRedis(t, testenv.RandomName("idemtest:")+":")
	ctx := context.Background()
	for _, k := range []string{"inflight", "done", "released"} {
		a, err := s.Acquire(ctx, idem.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		switch k {
		case "done":
			err = s.Complete(ctx, k, a.Fence, []byte("r"), 2*time.Hour)
		case "released":
			err = s.Release(ctx, k, a.Fence)
		}
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := s.Client().PTTL(ctx, s.KeyName(k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > 2*time.Hour {
			t.Errorf("%s: TTL %v, want a positive TTL up to its retention", k, ttl)
		}
	}
	if got := s.KeyName("a\x1fb"); got[len(got)-1] != '}' {
		t.Fatalf("key name %q has no hash tag", got)
	}
}

func TestMultiProcess(t *testing.T) {
	testenv.RedisClient(t).Close()
	storetest.MultiProcess(t, "TestMultiProcess", testenv.RandomName("idemtest:")+":", 4, 200, openAt)
}

func TestCrashTakeover(t *testing.T) {
	testenv.RedisClient(t).Close()
	storetest.CrashTakeover(t, "TestCrashTakeover", testenv.RandomName("idemtest:")+":", openAt)
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, newStore)
}

// TestCampaign runs the fault campaign with every process reaching Redis
// through a TCP proxy that the campaign cuts now and then.
func TestCampaign(t *testing.T) {
	testenv.RedisClient(t).Close()
	cfg := storetest.CampaignConfig{TestName: "TestCampaign", Processes: 2,
		Open: func(t testing.TB, location string) idem.Store {
			prefix, addr, _ := strings.Cut(location, " ")
			return testenv.OpenRedisAt(t, addr, prefix)
		}}
	if !storetest.IsChild() {
		p := testenv.RedisProxy(t)
		cfg.Cut, cfg.Restore = p.Cut, p.Restore
		cfg.Location = testenv.RandomName("idemtest:") + ": " + p.Addr()
	}
	storetest.Campaign(t, cfg)
}
