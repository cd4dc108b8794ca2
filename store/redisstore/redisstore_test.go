package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
	"github.com/idemgo/idem/store/storeurl"
)

func openAt(t testing.TB, prefix string) store.Store { return testenv.OpenRedis(t, prefix) }

func newStore(t testing.TB) store.Store { return openAt(t, testenv.RandomName("idemtest:")+":") }

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, ListsRecords: true, SelfExpiring: true}, newStore)
}

func TestEveryKeyHasTTL(t *testing.T) {
	s := testenv.OpenRedis(t, testenv.RandomName("idemtest:")+":")
	ctx := context.Background()
	for _, k := range []string{"inflight", "done", "released"} {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
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

// TestCampaign runs the fault campaign with every process reaching a Redis
// of its own through a TCP proxy that the campaign cuts and stalls now and
// then; it fills the server (maxmemory) now and then, and kills it with
// SIGKILL and starts it again (its append-only file fsynced before each
// answer: it loses nothing it acknowledged).
func TestCampaign(t *testing.T) {
	storetest.Campaign(t, campaignConfig(t, "TestCampaign", redisstore.Config{}))
}

// TestCampaignBuckets is TestCampaign with records in buckets.
func TestCampaignBuckets(t *testing.T) {
	storetest.Campaign(t, campaignConfig(t, "TestCampaignBuckets", redisstore.Config{Buckets: 1}))
}

// TestGuardCampaign runs guarded work (idem.Guard) under the same faults.
func TestGuardCampaign(t *testing.T) {
	if testing.Short() && !storetest.IsChild() {
		t.Skip("-short: sqlitestore's TestGuardCampaign runs the Guard campaign")
	}
	storetest.GuardCampaign(t, campaignConfig(t, "TestGuardCampaign", redisstore.Config{}))
}

// campaignConfig runs the campaign on stores configured as base (its
// prefix and client set by the campaign).
func campaignConfig(t *testing.T, name string, base redisstore.Config) storetest.CampaignConfig {
	testenv.RedisClient(t).Close()
	cfg := storetest.CampaignConfig{TestName: name, Processes: 2,
		Open: func(t testing.TB, location string) store.Store {
			prefix, addr, _ := strings.Cut(location, " ")
			c := base
			c.Prefix = prefix
			return testenv.OpenRedisConfig(t, addr, c)
		}}
	if !storetest.IsChild() {
		var srv *testenv.RedisServer
		srv, cfg.Fill, cfg.Unfill = testenv.StartDurableFillableRedis(t)
		cfg.Crash = func() {
			srv.Kill(t)
			srv.Start(t)
		}
		p := testenv.StartProxy(t, srv.Addr)
		cfg.Cut, cfg.Restore, cfg.Stall, cfg.Unstall = p.Cut, p.Restore, p.Stall, p.Unstall
		prefix := testenv.RandomName("idemtest:") + ":"
		cfg.Location, cfg.Direct = prefix+" "+p.Addr(), prefix+" "+srv.Addr
	}
	return cfg
}

// TestRetriedScriptsAreIdempotent: go-redis resends a command whose
// connection broke before the answer came back (MaxRetries), so a script
// may run twice for one call. Each call carries a nonce: the second run of
// an acquisition returns the claim the first one took (not InProgress, which
// would orphan it until its lease expires), and the second run of a settle
// reports success (not a stale fence, for a completion that happened). With
// buckets, a settled record keeps the call counter part of the nonce only
// (the fence names the owner), with the same effect.
func TestRetriedScriptsAreIdempotent(t *testing.T) {
	for _, buckets := range []int{0, 1} {
		t.Run(fmt.Sprintf("buckets=%d", buckets), func(t *testing.T) {
			s := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: buckets})
			ctx := context.Background()
			c := s.Client()
			keys, field := s.Locate("k")
			acquireScript, ownedScript := redisstore.AcquireScript(), redisstore.OwnedScript()
			args := func(a ...any) []any { return a }
			if buckets > 0 {
				acquireScript, ownedScript = redisstore.BucketAcquireScript, redisstore.BucketOwnedScript
				args = func(a ...any) []any { return append([]any{field}, a...) }
			}
			acquire := func() []any {
				v, err := c.Eval(ctx, acquireScript, keys, args(redisstore.EncodeFingerprint("fp"), 60000, 3600000, 0, "process\x00\x00\x00\x01")...).Slice()
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			first, again := acquire(), acquire()
			if first[0] != int64(store.Acquired) || again[0] != first[0] || again[1] != first[1] {
				t.Fatalf("acquire run twice: first %q, again %q — want the same claim", first, again)
			}
			rec, ok := redisstore.DecodeRecord(first[1].(string))
			if !ok {
				t.Fatalf("acquire answered %q", first[1])
			}
			settle := func(result, nonce string) int64 {
				n, err := c.Eval(ctx, ownedScript, keys, args("c", rec.Fence, 3600000, result, nonce)...).Int64()
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			if a, b := settle("done", "process\x00\x00\x00\x02"), settle("done", "process\x00\x00\x00\x02"); a != 1 || b != 1 {
				t.Fatalf("complete run twice: %d then %d, want 1 both times", a, b)
			}
			if a, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != store.Replayed || string(a.Record.Result) != "done" {
				t.Fatalf("after the retried calls: %v %q %v", a.Outcome, a.Record.Result, err)
			}
			// Another call's nonce is not a retry: a stale fence stays stale.
			if n := settle("zombie", "process\x00\x00\x00\x03"); n != 0 {
				t.Fatalf("a different call with the settled fence: %d, want 0", n)
			}
			if n := settle("done", "process\x00\x00\x00\x03"); n != 0 {
				t.Fatalf("a different call with the settled fence and the same result: %d, want 0", n)
			}
			if buckets > 0 {
				if in, err := c.HExists(ctx, keys[1], field).Result(); err != nil || !in {
					t.Fatalf("the record is not in its bucket: %v %v", in, err)
				}
			}
		})
	}
}

// TestClientsDoNotResend: the clients idem opens (store URLs, and the tests'
// own) have go-redis's resend turned off (MaxRetries -1 reads back as 0).
func TestClientsDoNotResend(t *testing.T) {
	p := testenv.RedisProxy(t)
	viaProxy := testenv.OpenRedisAt(t, p.Addr(), testenv.RandomName("idemtest:")+":")
	s, err := storeurl.Open(context.Background(), testenv.RedisURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for name, c := range map[string]any{"testenv": viaProxy.Client(), "storeurl": s.(*redisstore.Store).Client()} {
		if n := c.(*redis.Client).Options().MaxRetries; n != 0 {
			t.Errorf("%s client: MaxRetries %d, want resends off", name, n)
		}
	}
}

// TestConformanceUncoalesced runs the suite with every call its own round
// trip (Config.NoCoalesce).
func TestConformanceUncoalesced(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestConformance runs the suite; this runs it uncoalesced")
	}
	storetest.Run(t, storetest.Capabilities{Unclaims: true, FencedDeletes: true, ListsRecords: true, SelfExpiring: true}, func(t testing.TB) store.Store {
		prefix := testenv.RandomName("idemtest:") + ":"
		s, err := redisstore.New(redisstore.Config{Client: testenv.RedisClient(t), Prefix: prefix, CloseClient: true, NoCoalesce: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := context.Background()
			c := testenv.RedisClient(t)
			defer c.Close()
			it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for it.Next(ctx) {
				c.Del(ctx, it.Val())
			}
			s.Close()
		})
		return s
	})
}

// TestCoalescedPipelinesCarryManyCalls: 16 goroutines running lifecycles
// share pipelines, and every lifecycle ends as it would alone; a script the
// server has forgotten (SCRIPT FLUSH) is sent again with its source (the
// store sends scripts, as on a server without functions: Config.NoFunctions;
// TestFunctionsLoadedWhereMissing is this test with functions).
func TestCoalescedPipelinesCarryManyCalls(t *testing.T) {
	s := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", NoFunctions: true})
	done, flushed := make(chan struct{}), make(chan int)
	go func() { // the server forgets the scripts again and again meanwhile
		n := 0
		for {
			select {
			case <-done:
				flushed <- n
				return
			default:
			}
			if s.Client().ScriptFlush(context.Background()).Err() == nil {
				n++
			}
			time.Sleep(time.Millisecond)
		}
	}()
	testenv.CompleteMany(t, s, 16*100, func(i int) string { return fmt.Sprintf("many-%d", i) })
	close(done)
	t.Logf("the scripts were flushed %d times", <-flushed)
	trips, calls := s.CoalesceStats()
	t.Logf("%d shared pipelines carried %d calls", trips, calls)
	if trips == 0 || calls < 2*trips {
		t.Fatalf("16 goroutines at once shared %d pipelines carrying %d calls", trips, calls)
	}
	for i := range 16 * 100 {
		if rec, err := s.Get(context.Background(), fmt.Sprintf("many-%d", i)); err != nil || rec.State != store.StateCompleted {
			t.Fatalf("many-%d: %+v %v", i, rec, err)
		}
	}
}

// scriptCalls returns the calls of each command the scripts use (not the
// client's EVALSHA, INFO, HELLO) since the server's stats were last reset,
// and their sum.
func scriptCalls(t *testing.T, c redis.Cmdable) (map[string]int, int) {
	t.Helper()
	all, _ := commandStats(t, c)
	calls, total := map[string]int{}, 0
	for _, name := range []string{"time", "hget", "hmget", "hsetnx", "hset", "hdel", "hscan", "hgetall",
		"get", "set", "exists", "del", "type", "pexpiretime", "pexpireat"} {
		if n := all[name]; n > 0 {
			calls[name] = n
			total += n
		}
	}
	return calls, total
}

// TestAcquisitionCalls: an acquisition reads its record before it writes: a
// new key's is TIME, GET, SET; a duplicate's — the path a redelivery storm
// takes — TIME and GET alone, no write tried. (Writing a new key's claim
// first with SET NX saved 3% of a lifecycle's server instructions and cost
// a replay 25–44% more.)
func TestAcquisitionCalls(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	s := testenv.OpenRedisConfig(t, srv.Addr, redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":"})
	ctx := context.Background()
	c := s.Client()
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		if a, err := s.Acquire(ctx, store.AcquireRequest{Key: fmt.Sprint("k-", i), Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != store.Acquired {
			t.Fatalf("k-%d: %v %v", i, a.Outcome, err)
		}
	}
	if got, total := scriptCalls(t, c); total != 3*n {
		t.Errorf("%d acquisitions of new keys: %d Redis calls, want %d: %v", n, total, 3*n, got)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Acquire(ctx, store.AcquireRequest{Key: "k-0", Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != store.InProgress {
		t.Fatalf("a duplicate: %v %v", a.Outcome, err)
	}
	if got, total := scriptCalls(t, c); total != 2 || got["get"] != 1 {
		t.Errorf("the acquisition of a key with a record: %d Redis calls, want 2 (TIME, GET): %v", total, got)
	}
}
