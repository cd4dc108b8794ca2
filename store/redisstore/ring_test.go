package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
)

// TestRingKeepsEveryKeyOnItsShard: a go-redis Ring shards keys on the
// client, so a batch must never travel as one script (the Ring would send
// it to the first key's shard, and the other keys' records would be written
// where no later call looks for them: the work would run twice). Two shards
// here are two databases of the test Redis.
func TestRingKeepsEveryKeyOnItsShard(t *testing.T) {
	base := testenv.RedisClient(t)
	opt := base.Options()
	base.Close()
	host, port, err := net.SplitHostPort(opt.Addr)
	if err != nil {
		t.Fatal(err)
	}
	other := "localhost"
	if host == "localhost" {
		other = "127.0.0.1"
	}
	shards := map[string]string{"a": opt.Addr, "b": net.JoinHostPort(other, port)}
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:      shards,
		MaxRetries: -1,
		NewClient: func(o *redis.Options) *redis.Client {
			o.DB = 1
			if o.Addr == shards["b"] {
				o.DB = 2
			}
			return redis.NewClient(o)
		},
	})
	s, err := redisstore.New(redisstore.Config{Client: ring, Prefix: testenv.RandomName("idemtest:") + ":", CloseClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			k := fmt.Sprintf("ring-%d", i)
			a, err := s.Acquire(ctx, idem.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Minute})
			if err == nil && a.Outcome != idem.Acquired {
				err = fmt.Errorf("%s: %v", k, a.Outcome)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		k := fmt.Sprintf("ring-%d", i)
		if rec, err := s.Get(ctx, k); err != nil || rec.State != idem.StateInFlight {
			t.Fatalf("%s after its acquisition: %+v, %v — written on another shard", k, rec, err)
		}
		if a, err := s.Acquire(ctx, idem.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Minute}); err != nil || a.Outcome != idem.InProgress {
			t.Fatalf("%s acquired again: %v, %v — want InProgress", k, a.Outcome, err)
		}
	}
	if trips, calls := s.CoalesceStats(); trips == 0 {
		t.Fatalf("no shared trips (%d calls): the case did not batch", calls)
	}
}
