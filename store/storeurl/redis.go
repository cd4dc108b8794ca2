package storeurl

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
)

// Redis URLs are go-redis URLs (redis:// or rediss:// for TLS; pool_size and
// the other go-redis options work) plus idem's own options, removed before
// the URL is handed to go-redis:
//
//	idem_prefix=P      key prefix (default "idem:")
//	idem_cluster=1     Redis Cluster: the URL is a go-redis cluster URL (addr=… for more seeds)
//	idem_wait_replicas=N  every transition waits for N replicas (WAIT; redisstore.Config.WaitReplicas)
//	idem_buckets=N     records in hashes, many per hash (redisstore.Config.Buckets;
//	                   at least 16,384 hashes: size N to the records kept at once ÷ 64)
//	idem_coalesce=0    every call its own round trip (default 1: calls that wait
//	                   for the store together share a pipeline; redisstore.Config.NoCoalesce)
//	idem_functions=0   transitions sent as scripts (EVALSHA) only (default 1: as Redis
//	                   functions, FCALL, where the server has them; redisstore.Config.NoFunctions)
//
// Unless the URL sets max_retries, go-redis's resending of a command whose
// connection broke is turned off (see redisstore.Config.Client).
func init() {
	openers[Redis] = func(ctx context.Context, spec Spec, o Options) (store.Store, error) {
		u, err := url.Parse(spec.Raw)
		if err != nil {
			return nil, fmt.Errorf("idem: store URL: %v", err)
		}
		q := u.Query()
		prefix := q.Get("idem_prefix")
		cluster := q.Get("idem_cluster")
		wait := 0
		if w := q.Get("idem_wait_replicas"); w != "" {
			if wait, err = strconv.Atoi(w); err != nil || wait < 0 {
				return nil, fmt.Errorf("idem: store URL: idem_wait_replicas is %q, want a number of replicas", w)
			}
		}
		buckets := 0
		if b := q.Get("idem_buckets"); b != "" {
			if buckets, err = strconv.Atoi(b); err != nil || buckets < 0 {
				return nil, fmt.Errorf("idem: store URL: idem_buckets is %q, want a number of buckets", b)
			}
		}
		q.Del("idem_buckets")
		q.Del("idem_prefix")
		q.Del("idem_cluster")
		q.Del("idem_wait_replicas")
		noCoalesce, err := parseCoalesce(q.Get("idem_coalesce"))
		if err != nil {
			return nil, err
		}
		q.Del("idem_coalesce")
		var noFunctions bool
		switch f := q.Get("idem_functions"); f {
		case "", "1", "true":
		case "0", "false":
			noFunctions = true
		default:
			return nil, fmt.Errorf("idem: store URL: idem_functions is %q, want 1 or 0", f)
		}
		q.Del("idem_functions")
		u.RawQuery = q.Encode()
		var c redis.UniversalClient
		switch cluster {
		case "", "0", "false":
			opt, err := redis.ParseURL(u.String())
			if err != nil {
				return nil, fmt.Errorf("idem: store URL: %v", err)
			}
			if !q.Has("max_retries") {
				opt.MaxRetries = -1
			}
			c = redis.NewClient(opt)
		case "1", "true":
			opt, err := redis.ParseClusterURL(u.String())
			if err != nil {
				return nil, fmt.Errorf("idem: store URL: %v", err)
			}
			if !q.Has("max_retries") {
				opt.MaxRetries = -1
			}
			c = redis.NewClusterClient(opt)
		default:
			return nil, fmt.Errorf("idem: store URL: idem_cluster is %q, want 1 or 0", cluster)
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := c.Ping(pctx).Err(); err != nil {
			c.Close()
			return nil, fmt.Errorf("%w: redis at %s: %v", store.ErrUnavailable, u.Host, err)
		}
		s, err := redisstore.New(redisstore.Config{Client: c, Prefix: prefix, Limits: o.Limits, CloseClient: true, WaitReplicas: wait, NoCoalesce: noCoalesce,
			NoFunctions: noFunctions, Buckets: buckets})
		if err != nil {
			c.Close() // the store that would have closed it was refused
			return nil, err
		}
		return s, nil
	}
}
