package tieredstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/sqlitestore"
	"github.com/idemgo/idem/store/storetest"
	"github.com/idemgo/idem/store/tieredstore"
)

func newTiered(t testing.TB, hotRetention time.Duration) *tieredstore.Store {
	hot := memstore.New(memstore.Config{SweepInterval: -1})
	cold, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "cold.db")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, HotRetention: hotRetention})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformanceMemoryOverSQLite(t *testing.T) {
	storetest.Run(t, storetest.Capabilities{Persistent: true}, func(t testing.TB) store.Store { return newTiered(t, 0) })
}

func TestColdCatchesDuplicateAfterHotTTL(t *testing.T) {
	s := newTiered(t, 200*time.Millisecond)
	ctx := context.Background()
	req := store.AcquireRequest{Key: "PAY-1", Fingerprint: "fp", Lease: time.Minute, Retention: 72 * time.Hour}
	a, err := s.Acquire(ctx, req)
	if err != nil || a.Outcome != store.Acquired {
		t.Fatal(a.Outcome, err)
	}
	if err := s.Complete(ctx, "PAY-1", a.Fence, []byte("booked"), 72*time.Hour); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // the hot tier forgets
	for i := range 2 {                 // the first answer re-warms the hot tier
		r, err := s.Acquire(ctx, req)
		if err != nil || r.Outcome != store.Replayed || string(r.Record.Result) != "booked" {
			t.Fatalf("duplicate %d after the hot TTL: %v %q %v", i, r.Outcome, r.Record.Result, err)
		}
	}
	other := req
	other.Key = "PAY-2"
	b, err := s.Acquire(ctx, other)
	if err != nil || b.Outcome != store.Acquired {
		t.Fatal(b.Outcome, err)
	}
	if err := s.Complete(ctx, "PAY-2", b.Fence, []byte("x"), 72*time.Hour); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	other.Fingerprint = "different"
	if m, err := s.Acquire(ctx, other); err != nil || m.Outcome != store.Mismatch {
		t.Fatalf("mismatch against the cold tier: %v %v", m.Outcome, err)
	}
	other.Fingerprint = "fp"
	if r, err := s.Acquire(ctx, other); err != nil || r.Outcome != store.Replayed {
		t.Fatalf("after a mismatch the right payload replays: %v %v", r.Outcome, err)
	}
}

func TestNeedsArchiver(t *testing.T) {
	if _, err := tieredstore.New(tieredstore.Config{Hot: memstore.New(memstore.Config{}), Cold: struct{ store.Store }{}}); err == nil {
		t.Fatal("a cold tier that cannot archive was accepted")
	}
}

func TestConformanceRedisOverPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestConformanceMemoryOverSQLite runs the suite on two tiers; this runs it on Redis over PostgreSQL")
	}
	for _, buckets := range []int{0, 1} { // a key per Redis record, and records in buckets
		t.Run(fmt.Sprintf("buckets=%d", buckets), func(t *testing.T) {
			storetest.Run(t, storetest.Capabilities{Persistent: true}, func(t testing.TB) store.Store {
				hot := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: buckets})
				cold := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
				s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
				if err != nil {
					t.Fatal(err)
				}
				return s // the tiers close at their own cleanup
			})
		})
	}
}

// BenchmarkRedisOverPostgres measures the lifecycles and replays of the
// tiered store as deployed: Redis claims over a PostgreSQL archive (a fresh
// key's claim reads the cold tier, its completion archives there).
func BenchmarkRedisOverPostgres(b *testing.B) {
	storetest.Bench(b, func(t testing.TB) store.Store {
		hot := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":"})
		cold := testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
		s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestCampaign runs the fault campaign on Redis over PostgreSQL with a hot
// retention of 300ms (so claims and replays go through the cold tier), each
// tier reached through a TCP proxy that the campaign cuts or stalls now and
// then (the cold tier and the hot one in turn), and the hot tier's server
// (one of its own) filled now and then.
func TestCampaign(t *testing.T) { storetest.Campaign(t, campaignConfig(t, "TestCampaign", 0)) }

// TestCampaignBuckets is TestCampaign with the hot tier's records in
// buckets.
func TestCampaignBuckets(t *testing.T) {
	storetest.Campaign(t, campaignConfig(t, "TestCampaignBuckets", 1))
}

// TestGuardCampaign runs guarded work (idem.Guard) under the same faults.
func TestGuardCampaign(t *testing.T) {
	if testing.Short() && !storetest.IsChild() {
		t.Skip("-short: sqlitestore's TestGuardCampaign runs the Guard campaign")
	}
	storetest.GuardCampaign(t, campaignConfig(t, "TestGuardCampaign", 0))
}

func campaignConfig(t *testing.T, name string, buckets int) storetest.CampaignConfig {
	testenv.ProbePostgres(t)
	testenv.RedisClient(t).Close()
	const settle = 300 * time.Millisecond
	cfg := storetest.CampaignConfig{TestName: name, Processes: 2, InProgressAtExpiry: true, TakeoverOfMomentaryClaims: true, SettleExtendsLease: settle,
		Open: func(t testing.TB, location string) store.Store {
			parts := strings.SplitN(location, " ", 4) // prefix, Redis address, schema, PostgreSQL
			hot := testenv.OpenRedisConfig(t, parts[1], redisstore.Config{Prefix: parts[0], Buckets: buckets})
			cold := testenv.OpenPostgres(t, parts[2], pgstore.Config{ConnString: parts[3]})
			s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold, HotRetention: 300 * time.Millisecond, SettleTimeout: settle})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}}
	if !storetest.IsChild() {
		conn, cold := testenv.PostgresProxy(t)
		srv, fill, unfill := testenv.StartFillableRedis(t)
		hot := testenv.StartProxy(t, srv.Addr)
		cfg.Fill, cfg.Unfill = fill, unfill // the hot tier full
		// The faults, cuts and stalls, take the tiers in turn (one at a
		// time: the injector restores a tier before its next fault).
		var tier *testenv.Proxy
		n := 0
		next := func() *testenv.Proxy {
			if n++; n%2 == 0 {
				return hot
			}
			return cold
		}
		cfg.Cut = func() { tier = next(); tier.Cut() }
		cfg.Restore = func() { tier.Restore() }
		cfg.Stall = func() { tier = next(); tier.Stall() }
		cfg.Unstall = func() { tier.Unstall() }
		prefix, schema := testenv.RandomName("idemtest:")+":", testenv.RandomName("idemtest_")
		cfg.Location = prefix + " " + hot.Addr() + " " + schema + " " + conn
		cfg.Direct = prefix + " " + srv.Addr + " " + schema + " " + testenv.PostgresURL
	}
	return cfg
}

// TestServerWarnings: the tiered store gives the warnings of both tiers'
// servers (a Redis that may evict records, a PostgreSQL whose store
// commits asynchronously), each named by its tier, and none where a tier
// has nothing to say or cannot say (memory, SQLite).
func TestServerWarnings(t *testing.T) {
	ctx := context.Background()
	redisSrv := testenv.StartRedisServer(t, "--maxmemory-policy", "allkeys-lru", "--appendonly", "yes", "--appendfsync", "always")
	hot := testenv.OpenRedisAt(t, redisSrv.Addr, "tiered:")
	pg := testenv.StartPostgres(t)
	cold, err := pgstore.Open(ctx, pgstore.Config{ConnString: pg.URL + "&synchronous_commit=off"})
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Close()
	s, err := tieredstore.New(tieredstore.Config{Hot: hot, Cold: cold})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.ServerWarnings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !strings.HasPrefix(got[0], "hot tier: ") || !strings.Contains(got[0], "maxmemory-policy is allkeys-lru") ||
		!strings.HasPrefix(got[1], "cold tier: ") || !strings.Contains(got[1], "synchronous_commit is off") {
		t.Fatalf("warnings %q, want the hot tier's eviction policy and the cold tier's synchronous_commit", got)
	}
	if got, err := newTiered(t, 0).ServerWarnings(ctx); err != nil || len(got) != 0 {
		t.Fatalf("memory over SQLite: warnings %q, %v; want none", got, err)
	}
}
