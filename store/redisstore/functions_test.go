package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
)

// commandStats returns INFO commandstats as calls and rejected calls by
// command name ("fcall", "function|load", "evalsha").
func commandStats(t *testing.T, c redis.Cmdable) (calls, rejected map[string]int) {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls, rejected = map[string]int{}, map[string]int{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "calls":
				calls[name] = n
			case "rejected_calls":
				rejected[name] = n
			}
		}
	}
	return calls, rejected
}

// TestFunctionsLoadedWhereMissing: the transitions run as Redis functions
// (FCALL), not scripts, and a server that lost the library (FUNCTION
// FLUSH, as a replica promoted before it had it would be) gets it again
// from the first call that finds it missing, while 16 goroutines run
// lifecycles — a key per record and buckets, coalesced and not: every
// lifecycle ends as it would otherwise.
func TestFunctionsLoadedWhereMissing(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  redisstore.Config
	}{
		{"Key", redisstore.Config{}},
		{"KeyUncoalesced", redisstore.Config{NoCoalesce: true}},
		{"Buckets", redisstore.Config{Buckets: 1}},
		{"BucketsUncoalesced", redisstore.Config{Buckets: 1, NoCoalesce: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.StartRedisServer(t)
			tc.cfg.Prefix = testenv.RandomName("idemtest:") + ":"
			s := testenv.OpenRedisConfig(t, srv.Addr, tc.cfg)
			c := s.Client()
			ctx := context.Background()
			done, flushed := make(chan struct{}), make(chan int)
			go func() {
				n := 0
				for {
					select {
					case <-done:
						flushed <- n
						return
					default:
					}
					if c.FunctionFlush(ctx).Err() == nil {
						n++
					}
					time.Sleep(time.Millisecond)
				}
			}()
			testenv.CompleteMany(t, s, 16*50, func(i int) string { return fmt.Sprintf("fn-%d", i) })
			close(done)
			n := <-flushed
			for i := range 16 * 50 {
				if rec, err := s.Get(ctx, fmt.Sprintf("fn-%d", i)); err != nil || rec.State != store.StateCompleted {
					t.Fatalf("fn-%d: %+v %v", i, rec, err)
				}
			}
			calls, _ := commandStats(t, c)
			t.Logf("the library was flushed %d times and loaded %d times; %d FCALLs, %d EVALSHAs", n, calls["function|load"], calls["fcall"], calls["evalsha"])
			if n == 0 || calls["function|load"] < 2 {
				t.Fatalf("flushed %d times, loaded %d times: the library was not loaded again", n, calls["function|load"])
			}
			// Once the flushing stops, the calls go as functions again.
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			a, err := s.Acquire(ctx, store.AcquireRequest{Key: "after", Lease: time.Minute, Retention: time.Hour})
			if err == nil {
				err = s.Complete(ctx, "after", a.Fence, []byte("r"), time.Hour)
			}
			if err != nil {
				t.Fatal(err)
			}
			if calls, _ = commandStats(t, c); calls["fcall"] < 2 || calls["evalsha"]+calls["eval"] != 0 {
				t.Errorf("a lifecycle after the flushes: %d FCALLs, %d scripts; want the two transitions as functions", calls["fcall"], calls["evalsha"]+calls["eval"])
			}
			if trips, shared := s.CoalesceStats(); !tc.cfg.NoCoalesce && (trips == 0 || shared < 2*trips) {
				t.Errorf("16 goroutines at once shared %d round trips carrying %d calls", trips, shared)
			}
		})
	}
}

// TestFunctionsDeniedFallBackToScripts: a user the ACL denies FCALL and
// FUNCTION gets the scripts (EVALSHA) instead; after the first refusal the
// store does not try functions again.
func TestFunctionsDeniedFallBackToScripts(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", "nofunctions", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []redisstore.Config{{}, {Buckets: 1}, {NoCoalesce: true}} {
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		cfg.Client = redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nofunctions", Password: "pw"})
		cfg.CloseClient = true
		cfg.Prefix = testenv.RandomName("idemtest:") + ":"
		s, err := redisstore.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			key := fmt.Sprint("k-", i)
			a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Lease: time.Minute, Retention: time.Hour})
			if err != nil || a.Outcome != store.Acquired {
				t.Fatalf("%s: %v %v", key, a.Outcome, err)
			}
			if err := s.Complete(ctx, key, a.Fence, []byte("r"), time.Hour); err != nil {
				t.Fatal(err)
			}
			if a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != store.Replayed {
				t.Fatalf("%s again: %v %v", key, a.Outcome, err)
			}
		}
		s.Close()
		calls, rejected := commandStats(t, admin)
		if tried := calls["fcall"] + rejected["fcall"]; tried != 1 || calls["evalsha"] < 60 {
			t.Errorf("buckets %d, uncoalesced %v: %d FCALLs tried, %d EVALSHAs; want one FCALL (refused), then scripts", cfg.Buckets, cfg.NoCoalesce, tried, calls["evalsha"])
		}
	}
}

// TestConformanceScripts runs the suite on stores that send their
// transitions as scripts (Config.NoFunctions, as on a server without
// functions): a key per record and buckets, coalesced and not.
func TestConformanceScripts(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestConformance runs the suite; this runs it again as scripts")
	}
	caps := storetest.Capabilities{Unclaims: true, FencedDeletes: true, ListsRecords: true, SelfExpiring: true}
	for _, tc := range []struct {
		name string
		cfg  redisstore.Config
	}{
		{"Key", redisstore.Config{NoFunctions: true}},
		{"KeyUncoalesced", redisstore.Config{NoFunctions: true, NoCoalesce: true}},
		{"Buckets", redisstore.Config{NoFunctions: true, Buckets: 1}},
		{"BucketsUncoalesced", redisstore.Config{NoFunctions: true, Buckets: 1, NoCoalesce: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, caps, func(t testing.TB) store.Store {
				cfg := tc.cfg
				cfg.Prefix = testenv.RandomName("idemtest:") + ":"
				return testenv.OpenRedisConfig(t, "", cfg)
			})
		})
	}
}
