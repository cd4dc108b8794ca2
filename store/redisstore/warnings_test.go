package redisstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
)

// TestServerWarnings: an eviction policy that may drop records is named,
// and with buckets a hash-max-listpack-value under 128; a server set as
// idem recommends gives none. (The settings are restored afterwards.)
func TestServerWarnings(t *testing.T) {
	c := testenv.RedisClient(t)
	defer c.Close()
	ctx := context.Background()
	was, err := c.ConfigGet(ctx, "*max*").Result()
	if err != nil {
		t.Fatal(err)
	}
	defer c.ConfigSet(ctx, "maxmemory-policy", was["maxmemory-policy"])
	defer c.ConfigSet(ctx, "hash-max-listpack-value", was["hash-max-listpack-value"])
	plain := testenv.OpenRedis(t, testenv.RandomName("idemtest:")+":")
	bucketed := openBuckets(t, testenv.RandomName("idemtest:")+":")
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
