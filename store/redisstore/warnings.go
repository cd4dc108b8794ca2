package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ServerWarnings reads the server settings idem's promises or figures
// depend on (on every master of a Cluster or shard of a Ring) and says what
// is off: no append-only file, so that a restart of the server forgets its
// records (every one, or those written since the last snapshot) and their
// keys then run again as new; an append-only file that Redis leaves the
// operating system to write when it likes (appendfsync no) or fsyncs
// every second (everysec), so that a crash loses the last of them; an
// eviction policy other
// than noeviction, under which Redis may drop a record before its expiry
// when memory runs short (a duplicate then runs as new); and, with
// Config.Buckets, a hash-max-listpack-value under 128, which turns buckets
// holding records with a result over 28 bytes (at the default 64) into hash
// tables (162 bytes per record instead of ~95). It also names a
// master with replicas where Config.WaitReplicas is 0: Redis replicates
// after it answers, and a failover to a replica (Sentinel, Cluster) loses
// the last acknowledged records; or fewer than its replicas: a failover
// while the master still takes writes (SENTINEL FAILOVER) promotes one
// replica while another acknowledges the old master's writes, then
// discards them. A server that refuses
// CONFIG GET or INFO (a managed Redis may) yields its error and no
// warnings.
func (s *Store) ServerWarnings(ctx context.Context) ([]string, error) {
	var mu sync.Mutex
	var warnings []string
	err := s.forEachNode(ctx, func(ctx context.Context, c *redis.Client) error {
		var cfgCmd *redis.MapStringStringCmd
		var infoCmd *redis.StringCmd
		if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error { // one round trip
			cfgCmd, infoCmd = p.ConfigGet(ctx, "*"), p.Info(ctx, "replication")
			return nil
		}); err != nil {
			return err
		}
		cfg, replication := cfgCmd.Val(), infoCmd.Val()
		var found []string
		switch addr := c.Options().Addr; {
		case cfg["appendonly"] == "no" && strings.TrimSpace(cfg["save"]) == "":
			found = append(found, fmt.Sprintf("%s: no persistence (appendonly no, no snapshots): a restart of the server forgets every record, and their keys then run again as new; set appendonly yes (appendfsync always loses nothing acknowledged)", addr))
		case cfg["appendonly"] == "no":
			found = append(found, fmt.Sprintf("%s: appendonly is no: a restart of the server forgets every record written since its last snapshot (save %s), and their keys then run again as new; set appendonly yes (appendfsync always loses nothing acknowledged)", addr, cfg["save"]))
		case cfg["appendfsync"] == "no":
			found = append(found, fmt.Sprintf("%s: appendfsync is no: Redis leaves the append-only file to the operating system, and a crash of the machine loses the records it had not written; set appendfsync always", addr))
		case cfg["appendfsync"] == "everysec":
			found = append(found, fmt.Sprintf("%s: appendfsync is everysec: a crash of the machine, or of the server while its disk lags (Redis then answers before it writes the file), loses up to two seconds of acknowledged records, and their keys then run again as new; appendfsync always loses none", addr))
		}
		if p := cfg["maxmemory-policy"]; p != "" && p != "noeviction" {
			found = append(found, fmt.Sprintf("%s: maxmemory-policy is %s: when memory runs short Redis may evict an idempotency record before its expiry, and its key then runs again as new; set noeviction", c.Options().Addr, p))
		}
		if v, _ := strconv.Atoi(cfg["hash-max-listpack-value"]); s.bucketsPerSlot > 0 && v < 128 {
			found = append(found, fmt.Sprintf("%s: hash-max-listpack-value is %d: a bucket holding a record over %d bytes becomes a hash table (162 bytes per record instead of ~95; at 64 a record of a compact key fits with a result of up to 28 bytes, at 128 up to 92); set it to 128", c.Options().Addr, v, v))
		}
		switch n, _ := strconv.Atoi(infoField(replication, "connected_slaves")); {
		case n > 0 && s.waitReplicas == 0:
			found = append(found, fmt.Sprintf("%s: %d replica(s) and Config.WaitReplicas 0: Redis replicates a write after it answers, so a failover to a replica loses the last acknowledged records, and their keys then run again as new (claims: beside their first owner); set WaitReplicas to the number of replicas (idem_wait_replicas=%d in a store URL)", c.Options().Addr, n, n))
		case n > s.waitReplicas && s.waitReplicas > 0:
			found = append(found, fmt.Sprintf("%s: %d replica(s) and Config.WaitReplicas %d: a failover that promotes a replica while this master still takes writes (SENTINEL FAILOVER, CLUSTER FAILOVER FORCE, a partition) discards what only the other replicas acknowledged, and those keys run again as new; set WaitReplicas to %d (a replica down then fails writes closed)", c.Options().Addr, n, s.waitReplicas, n))
		}
		mu.Lock()
		warnings = append(warnings, found...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, wrap("config get", err)
	}
	slices.Sort(warnings)
	return warnings, nil
}

// infoField is the value of name in an INFO reply ("" where absent).
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
