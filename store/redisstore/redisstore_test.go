package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
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
	location := ""
	var cut, restore func()
	if !storetest.IsChild() {
		opt, err := redis.ParseURL(testenv.RedisURL)
		if err != nil {
			t.Fatal(err)
		}
		p := testenv.StartProxy(t, opt.Addr)
		cut, restore = p.Cut, p.Restore
		location = testenv.RandomName("idemtest:") + ": " + p.Addr()
	}
	open := func(t testing.TB, location string) idem.Store {
		prefix, addr, _ := strings.Cut(location, " ")
		opt, _ := redis.ParseURL(testenv.RedisURL)
		opt.Addr = addr
		c := redis.NewClient(opt)
		s, err := redisstore.New(redisstore.Config{Client: c, Prefix: prefix, CloseClient: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !storetest.IsChild() {
				cleanup := testenv.RedisClient(t)
				ctx := context.Background()
				it := cleanup.Scan(ctx, 0, prefix+"*", 1000).Iterator()
				for it.Next(ctx) {
					cleanup.Del(ctx, it.Val())
				}
				cleanup.Close()
			}
			s.Close()
		})
		return s
	}
	storetest.Campaign(t, storetest.CampaignConfig{TestName: "TestCampaign", Location: location, Open: open,
		Processes: 2, Cut: cut, Restore: restore})
}
