package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
)

var redisURL = testenv.URL("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

func client(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = c.Ping(ctx).Err()
	if err != nil {
		c.Close()
	}
	testenv.Need(t, "Redis", redisURL, err)
	return c
}

func randomPrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest:" + hex.EncodeToString(b[:]) + ":"
}

// openAt opens the store under a key prefix; the test that is not a child
// deletes the prefix's keys at cleanup.
func openAt(t testing.TB, prefix string) idem.Store {
	c := client(t)
	s, err := redisstore.New(redisstore.Config{Client: c, Prefix: prefix, CloseClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !storetest.IsChild() {
			ctx := context.Background()
			it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for it.Next(ctx) {
				c.Del(ctx, it.Val())
			}
		}
		s.Close()
	})
	return s
}

func newStore(t testing.TB) idem.Store { return openAt(t, randomPrefix()) }

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{ListsRecords: true, SelfExpiring: true}, newStore)
}

func TestEveryKeyHasTTL(t *testing.T) {
	s := newStore(t).(*redisstore.Store)
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
	client(t).Close()
	storetest.MultiProcess(t, "TestMultiProcess", randomPrefix(), 4, 200, openAt)
}

func TestCrashTakeover(t *testing.T) {
	client(t).Close()
	storetest.CrashTakeover(t, "TestCrashTakeover", randomPrefix(), openAt)
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, newStore)
}
