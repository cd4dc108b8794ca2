package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
)

// TestRingKeepsEveryKeyOnItsShard: a go-redis Ring shards keys on the
// client, so a batch must never travel as one script (the Ring would send
// it to the first key's shard, and the other keys' records would be written
// where no later call looks for them: the work would run twice); List and
// Scan walk every shard; WAIT, which names no key, is refused. Two shards
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
	if _, err := redisstore.New(redisstore.Config{Client: ring, WaitReplicas: 1}); err == nil || !strings.Contains(err.Error(), "Ring") {
		t.Fatalf("WaitReplicas on a Ring: %v, want refused", err)
	}
	s, err := redisstore.New(redisstore.Config{Client: ring, Prefix: testenv.RandomName("idemtest:") + ":", CloseClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	// Rounds of 64 acquisitions at once, until calls shared a trip (on a
	// loaded machine the goroutines of one round may run one after
	// another).
	const n = 64
	total := 0 // records made
	for round := 0; ; round++ {
		total += n
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				k := fmt.Sprintf("ring-%d-%d", round, i)
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Minute})
				if err == nil && a.Outcome != store.Acquired {
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
			k := fmt.Sprintf("ring-%d-%d", round, i)
			if rec, err := s.Get(ctx, k); err != nil || rec.State != store.StateInFlight {
				t.Fatalf("%s after its acquisition: %+v, %v — written on another shard", k, rec, err)
			}
			if a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Minute}); err != nil || a.Outcome != store.InProgress {
				t.Fatalf("%s acquired again: %v, %v — want InProgress", k, a.Outcome, err)
			}
		}
		if trips, _ := s.CoalesceStats(); trips > 0 {
			break
		}
		if round == 49 {
			t.Fatal("no shared trips in 50 rounds of 64 acquisitions at once: the case did not batch")
		}
	}
	// Both shards hold records, and the operator's walks see them all.
	perShard := map[string]int{}
	var mu sync.Mutex // ForEachShard calls at once
	if err := ring.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := c.DBSize(ctx).Result()
		mu.Lock()
		perShard[c.Options().Addr] = int(n)
		mu.Unlock()
		return err
	}); err != nil || len(perShard) != 2 || perShard[shards["a"]] == 0 || perShard[shards["b"]] == 0 {
		t.Fatalf("keys per shard: %v, %v — want both shards used", perShard, err)
	}
	if recs, err := s.List(ctx, "", 10_000); err != nil || len(recs) != total {
		t.Fatalf("List over the Ring: %d records, %v; want %d", len(recs), err, total)
	}
	seen, cursor := 0, ""
	for {
		recs, next, err := s.Scan(ctx, cursor, 10)
		if err != nil {
			t.Fatal(err)
		}
		seen += len(recs)
		if next == "" {
			break
		}
		cursor = next
	}
	if seen != total {
		t.Fatalf("a Scan walk over the Ring saw %d records, want %d", seen, total)
	}
}

// TestRingShardDownFailsClosed: a go-redis Ring takes a shard that misses
// three heartbeats (1.5 s by default) out of its hash and sends that
// shard's keys to the others — where a duplicate finds no record and runs
// again. The store must not follow: while a shard is down, calls on its
// keys fail closed; once it is back, its records answer again. Two real
// Redis servers, one behind a proxy the test cuts.
func TestRingShardDownFailsClosed(t *testing.T) {
	a, b := testenv.StartRedisServer(t), testenv.StartRedisServer(t)
	proxy := testenv.StartProxy(t, a.Addr)
	shards := map[string]string{"a": proxy.Addr(), "b": b.Addr}
	ring := redis.NewRing(&redis.RingOptions{Addrs: shards, MaxRetries: -1, DialerRetries: 1})
	s, err := redisstore.New(redisstore.Config{Client: ring, Prefix: "idemtest:ring:", CloseClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const n = 40
	key := func(i int) string { return fmt.Sprintf("ring-down-%d", i) }
	testenv.CompleteMany(t, s, n, key)
	onA := map[string]bool{}
	direct := redis.NewClient(&redis.Options{Addr: a.Addr})
	defer direct.Close()
	for i := range n {
		if direct.Exists(ctx, s.KeyName(key(i))).Val() == 1 {
			onA[key(i)] = true
		}
	}
	if len(onA) == 0 || len(onA) == n {
		t.Fatalf("%d of %d keys on shard a: want both shards used", len(onA), n)
	}

	proxy.Cut()
	// The Ring given to the store has taken shard a out by now.
	testenv.Eventually(t, 10*time.Second, "the Ring taking shard a out", func() error {
		if l := ring.Len(); l != 1 {
			return fmt.Errorf("%d shards up", l)
		}
		return nil
	})
	ran := 0
	for i := range n {
		k := key(i)
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
		switch {
		case err == nil && a.Outcome.Owns():
			ran++
			t.Errorf("%s (completed on shard %v) claimed again while shard a is down: its work would run twice", k, map[bool]string{true: "a", false: "b"}[onA[k]])
		case onA[k] && !errors.Is(err, store.ErrUnavailable):
			t.Errorf("%s, on the shard that is down: %v, %v; want ErrStoreUnavailable", k, a.Outcome, err)
		case !onA[k] && (err != nil || a.Outcome != store.Replayed):
			t.Errorf("%s, on the shard that is up: %v, %v; want Replayed", k, a.Outcome, err)
		}
	}
	if _, _, err := s.Scan(ctx, "", 1000); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("a Scan walk while shard a is down: %v; want ErrStoreUnavailable (it would miss its records)", err)
	}

	proxy.Restore()
	testenv.Eventually(t, 10*time.Second, "shard a answering again", func() error {
		for k := range onA {
			_, err := s.Get(ctx, k)
			return err
		}
		return nil
	})
	for i := range n {
		if a, err := s.Acquire(ctx, store.AcquireRequest{Key: key(i), Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != store.Replayed {
			t.Errorf("%s once shard a is back: %v, %v; want Replayed", key(i), a.Outcome, err)
		}
	}
}
