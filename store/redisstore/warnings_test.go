package redisstore_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
)

// TestServerWarnings: an eviction policy that may drop records is named,
// and with buckets a hash-max-listpack-value under 128; a server set as idem recommends (its
// append-only file fsynced always) gives none.
func TestServerWarnings(t *testing.T) {
	srv := testenv.StartRedisServer(t, "--appendonly", "yes", "--appendfsync", "always")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	ctx := context.Background()
	plain := testenv.OpenRedisAt(t, srv.Addr, "idemtest:")
	bucketed := testenv.OpenRedisConfig(t, srv.Addr, redisstore.Config{Prefix: "idemtest:", Buckets: 1})
	for _, tc := range []struct {
		policy, value string
		s             *redisstore.Store
		want          []string
	}{
		{"noeviction", "128", plain, nil},
		{"noeviction", "128", bucketed, nil},
		{"noeviction", "64", plain, nil},
		{"noeviction", "64", bucketed, []string{"hash-max-listpack-value is 64"}},
		{"allkeys-lru", "128", plain, []string{"maxmemory-policy is allkeys-lru", "set noeviction"}},
		{"volatile-ttl", "64", bucketed, []string{"hash-max-listpack-value is 64", "maxmemory-policy is volatile-ttl"}},
	} {
		if err := c.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.ConfigSet(ctx, "hash-max-listpack-value", tc.value).Err(); err != nil {
			t.Fatal(err)
		}
		warnings, err := tc.s.ServerWarnings(ctx)
		if err != nil {
			t.Fatal(err)
		}
		all := strings.Join(warnings, "\n")
		for _, w := range tc.want {
			if !strings.Contains(all, w) {
				t.Errorf("%s, listpack value %s, buckets %v: warnings %q, without %q", tc.policy, tc.value, tc.s == bucketed, warnings, w)
			}
		}
		if len(tc.want) == 0 && len(warnings) > 0 {
			t.Errorf("%s, listpack value %s, buckets %v: warnings %q, want none", tc.policy, tc.value, tc.s == bucketed, warnings)
		}
	}
}

// TestPersistenceWarnings: a Redis without an append-only file forgets its
// records when it restarts — all of them, or those since its last
// snapshot — and their keys then run again; one whose append-only file
// the operating system writes when it likes (appendfsync no) loses the
// last of them to a crash of the machine, and one that fsyncs it every
// second (everysec) up to two seconds of them, to a crash of the server
// too while the disk lags (see the README's durability matrix). Each is
// named; appendfsync always gives no warning.
func TestPersistenceWarnings(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--appendonly", "no", "--save", ""}, "no persistence (appendonly no, no snapshots)"},
		{[]string{"--appendonly", "no", "--save", "3600 1"}, "appendonly is no"},
		{[]string{"--appendonly", "yes", "--appendfsync", "no"}, "appendfsync is no"},
		{[]string{"--appendonly", "yes", "--appendfsync", "everysec"}, "appendfsync is everysec"},
		{[]string{"--appendonly", "yes", "--appendfsync", "always"}, ""},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			srv := testenv.StartRedisServer(t, c.args...)
			warnings, err := testenv.OpenRedisAt(t, srv.Addr, "idemtest:").ServerWarnings(ctx)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want == "" && len(warnings) > 0:
				t.Fatalf("warnings %q, want none", warnings)
			case c.want != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], c.want)):
				t.Fatalf("warnings %q, want one saying %q", warnings, c.want)
			}
		})
	}
}

// TestReplicaWarning: a master with a replica, written to without WAIT
// (Config.WaitReplicas 0), loses its last acknowledged records to a
// failover: ServerWarnings says so, and not where the store waits for the
// replica.
func TestReplicaWarning(t *testing.T) {
	ctx := context.Background()
	persistent := []string{"--appendonly", "yes", "--appendfsync", "always"}
	master := testenv.StartRedisServer(t, persistent...)
	host, port, _ := net.SplitHostPort(master.Addr)
	// Two replicas: a WAIT for one of them is satisfied by either, and a
	// failover that promotes the other while the master still takes writes
	// (SENTINEL FAILOVER) discards what only the first acknowledged
	// (TestSentinelManualFailover).
	for range 2 {
		testenv.StartRedisServer(t, append(persistent, "--replicaof", host, port)...)
	}
	mc := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer mc.Close()
	testenv.Eventually(t, 30*time.Second, "the replicas connect", func() error {
		info, err := mc.Info(ctx, "replication").Result()
		if err == nil && !strings.Contains(info, "connected_slaves:2") {
			err = errors.New("not every replica connected yet")
		}
		return err
	})
	for _, c := range []struct {
		wait int
		want string
	}{{0, "2 replica(s) and Config.WaitReplicas 0"}, {1, "2 replica(s) and Config.WaitReplicas 1"}, {2, ""}} {
		warnings, err := testenv.OpenRedisConfig(t, master.Addr, redisstore.Config{Prefix: "idemtest:", WaitReplicas: c.wait}).ServerWarnings(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.want == "" && len(warnings) > 0 || c.want != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], c.want)) {
			t.Fatalf("WaitReplicas %d: warnings %q, want one saying %q", c.wait, warnings, c.want)
		}
	}
}
