package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/faustbrian/go-idempotency/valkey"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/redis/go-redis/v9"
	valkeygo "github.com/valkey-io/valkey-go"
)

// redisComparisons runs both libraries over the same Redis, each with its
// own client (go-redis, pool of 8; valkey-go, which pipelines concurrent
// calls on its connection). Their keys have prefixes of their own, deleted
// at the end.
func redisComparisons(ctx context.Context, cfg config) ([]comparison, error) {
	const workers = 8
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	idemPrefix, peerPrefix := "peerbench-idem-"+run+":", "peerbench-peer-"+run

	rc := redis.NewClient(&redis.Options{Addr: cfg.redisAddr, PoolSize: workers})
	if err := rc.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis at %s: %w", cfg.redisAddr, err)
	}
	vc, err := valkeygo.NewClient(valkeygo.ClientOption{InitAddress: []string{cfg.redisAddr}, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("valkey-go client: %w", err)
	}
	newIdem := func() (runner, error) {
		s, err := redisstore.New(redisstore.Config{Client: rc, Prefix: idemPrefix})
		if err != nil {
			return runner{}, err
		}
		return idemRunner(s, func() {})
	}
	newPeer := func() (runner, error) {
		// valkey.New, not Open: Open refuses a server that is not Valkey.
		s, err := valkey.New(vc, valkey.Options{Prefix: peerPrefix, Retention: 24 * time.Hour, OwnerTokens: ownerTokens()})
		if err != nil {
			return runner{}, err
		}
		return peerRunner(s, func() {})
	}
	cleanup := func() {
		for _, pattern := range []string{idemPrefix + "*", peerPrefix + "*"} {
			iter := rc.Scan(ctx, 0, pattern, 1000).Iterator()
			var batch []string
			for iter.Next(ctx) {
				if batch = append(batch, iter.Val()); len(batch) == 1000 {
					rc.Unlink(ctx, batch...)
					batch = batch[:0]
				}
			}
			if len(batch) > 0 {
				rc.Unlink(ctx, batch...)
			}
		}
		rc.Close()
		vc.Close()
	}
	return runComparisons("redis", workers, cfg.ops(20_000), cfg.ops(40_000), newIdem, newPeer, cleanup)
}
