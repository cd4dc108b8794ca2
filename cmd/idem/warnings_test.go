package main

import (
	"bytes"
	"context"
	"log"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/redisstore"
)

// TestServeLogsServerWarnings: idem serve logs what a Redis store says is
// off in its server's settings (redisstore.Store.ServerWarnings), here a
// bucketed store's hash-max-listpack-value when the server keeps it under
// 128; a store without such settings logs nothing.
func TestServeLogsServerWarnings(t *testing.T) {
	ctx := context.Background()
	var out bytes.Buffer
	logger := log.New(&out, "", 0)
	logServerWarnings(ctx, memstore.New(memstore.Config{}), logger)
	if out.Len() != 0 {
		t.Fatalf("the memory store: %q", out.String())
	}
	s := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: 1})
	cfg, err := s.Client().ConfigGet(ctx, "hash-max-listpack-value").Result()
	if err != nil {
		t.Fatal(err)
	}
	value, _ := strconv.Atoi(cfg["hash-max-listpack-value"])
	logServerWarnings(ctx, s, logger)
	if got := strings.Contains(out.String(), "hash-max-listpack-value is "+strconv.Itoa(value)); got != (value < 128) {
		t.Fatalf("hash-max-listpack-value %d: logged %q", value, out.String())
	}
}
