package redisstore_test

import (
	"context"
	"testing"

	"github.com/idemgo/idem/internal/testenv"
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
