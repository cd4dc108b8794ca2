package redisstore_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
)

// BenchmarkRemote runs lifecycles against Redis through a proxy that
// delays each direction by a millisecond — a server a few milliseconds of
// round trip away — coalesced and not, from 8 and 32 goroutines (on 2
// cores; -cpu scales them). Coalescing must not lose here either: a
// setting that keeps too few round trips in flight is fastest on loopback
// and slowest at a distance (the settings in coalesce.go were checked
// against this). Compare the lifecycles/s of a pair:
//
//	go test -run '^$' -bench Remote -benchtime 5s ./store/redisstore
func BenchmarkRemote(b *testing.B) {
	p := testenv.RedisProxy(b)
	p.SetDelay(time.Millisecond)
	for _, workers := range []int{8, 32} {
		for _, coalesce := range []bool{true, false} {
			b.Run(fmt.Sprintf("workers=%d/coalesce=%v", workers, coalesce), func(b *testing.B) {
				storetest.BenchLifecycle(b, func(t testing.TB) store.Store {
					return testenv.OpenRedisConfig(t, p.Addr(), redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", NoCoalesce: !coalesce})
				}, max(1, workers/runtime.GOMAXPROCS(0)))
			})
		}
	}
}
