package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
)

// TestRecordBytes reports what one completed record costs in Redis (MEMORY
// USAGE of its hash) with raw and compact keys.
func TestRecordBytes(t *testing.T) {
	s := testenv.OpenRedis(t, testenv.RandomName("idemtest:")+":")
	storetest.RecordBytes(t, s, "Redis MEMORY USAGE", func(key string) (int64, error) {
		return s.Client().MemoryUsage(context.Background(), s.KeyName(key)).Result()
	})
}

// TestMemoryPerRecord reports Redis's used_memory growth per completed
// record (storetest.MemoryPerRecord; -recordbytes.n sets how many).
func TestMemoryPerRecord(t *testing.T) {
	s := testenv.OpenRedis(t, testenv.RandomName("idemtest:")+":")
	storetest.MemoryPerRecord(t, s, "Redis used_memory", func() (int64, error) {
		return usedMemory(s.Client())
	})
}

// usedMemory is INFO memory's used_memory.
func usedMemory(c redis.UniversalClient) (int64, error) {
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO memory has no used_memory: %q", info)
}

// TestMemoryPerRecordBuckets is TestMemoryPerRecord with records in
// buckets (Config.Buckets sized to the records, 64 per bucket), under the
// server's hash-max-listpack-value as it is and at 128, the setting
// Config.Buckets recommends (restored afterwards).
func TestMemoryPerRecordBuckets(t *testing.T) {
	c := testenv.RedisClient(t)
	defer c.Close()
	ctx := context.Background()
	cfg, err := c.ConfigGet(ctx, "hash-max-listpack-value").Result()
	if err != nil {
		t.Fatal(err)
	}
	was := cfg["hash-max-listpack-value"]
	defer c.ConfigSet(ctx, "hash-max-listpack-value", was)
	for _, value := range []string{was, "128"} {
		t.Run("hash-max-listpack-value="+value, func(t *testing.T) {
			if err := c.ConfigSet(ctx, "hash-max-listpack-value", value).Err(); err != nil {
				t.Fatal(err)
			}
			for _, compact := range []bool{false, true} { // each kind in buckets of its own
				s := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: storetest.RecordsForBytes() / 64})
				storetest.MemoryPerRecordOf(t, s, compact, "Redis used_memory, buckets", func() (int64, error) {
					return usedMemory(s.Client())
				})
			}
		})
	}
}
