package testenv

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MoveSlot moves a slot of the cluster to the master at to, the way
// `redis-cli --cluster reshard` moves it — the slot IMPORTING on the
// target and MIGRATING on its owner, its keys moved with MIGRATE, then the
// slot given to the target on every master — but one key at a time,
// calling between once the slot is migrating and after each key, so that
// a test's calls meet the slot half moved: keys already on the target (the
// owner answers ASK), keys split between both (TRYAGAIN). It returns how
// many keys it moved (0, and nothing done, when the slot is already the
// target's).
func (c *RedisCluster) MoveSlot(t testing.TB, slot int, to string, between func()) int {
	t.Helper()
	ctx := context.Background()
	from := c.SlotOwner(t, slot)
	if from == to {
		return 0
	}
	src, dst := redis.NewClient(&redis.Options{Addr: from}), redis.NewClient(&redis.Options{Addr: to})
	defer src.Close()
	defer dst.Close()
	srcID, dstID := nodeID(t, src), nodeID(t, dst)
	must := func(cmd redis.Cmder) {
		t.Helper()
		if err := cmd.Err(); err != nil {
			t.Fatalf("moving slot %d from %s to %s: %v: %v", slot, from, to, cmd.Args(), err)
		}
	}
	must(dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID))
	must(src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID))
	host, port, _ := net.SplitHostPort(to)
	between()
	moved := 0
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 1).Result()
		if err != nil {
			t.Fatalf("CLUSTER GETKEYSINSLOT %d on %s: %v", slot, from, err)
		}
		if len(keys) == 0 {
			break
		}
		// NOKEY (the key expired meanwhile) is an answer, not an error.
		must(src.Do(ctx, "MIGRATE", host, port, "", 0, 5000, "KEYS", keys[0]))
		moved++
		between()
	}
	// The target first, then the source (as redis-cli does), then the
	// other masters, which would learn it by gossip.
	must(dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID))
	must(src.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID))
	for _, m := range c.Masters(t) {
		if m != from && m != to {
			rc := redis.NewClient(&redis.Options{Addr: m})
			must(rc.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID))
			rc.Close()
		}
	}
	Eventually(t, 10*time.Second, fmt.Sprintf("every node serving slot %d from %s", slot, to), func() error {
		for _, addr := range c.Addrs {
			if owner := slotOwner(addr, slot); owner != to {
				return fmt.Errorf("%s says %q", addr, owner)
			}
		}
		return nil
	})
	return moved
}

// SlotOwner returns the address of the master serving slot, as the
// cluster's first node reports it.
func (c *RedisCluster) SlotOwner(t testing.TB, slot int) string {
	t.Helper()
	owner := slotOwner(c.Addrs[0], slot)
	if owner == "" {
		t.Fatalf("no node serves slot %d", slot)
	}
	return owner
}

// Masters returns the addresses of the cluster's masters (CLUSTER NODES).
func (c *RedisCluster) Masters(t testing.TB) []string {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: c.Addrs[0]})
	defer rc.Close()
	nodes, err := rc.ClusterNodes(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && strings.Contains(f[2], "master") && !strings.Contains(f[2], "fail") {
			addr, _, _ := strings.Cut(f[1], "@")
			out = append(out, addr)
		}
	}
	return out
}

// slotOwner is the master serving slot as the node at addr sees it ("" if
// none or the node does not answer).
func slotOwner(addr string, slot int) string {
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	//lint:ignore SA1019 CLUSTER SLOTS answers on every Redis the tests may start
	ranges, err := rc.ClusterSlots(context.Background()).Result()
	if err != nil {
		return ""
	}
	for _, r := range ranges {
		if r.Start <= slot && slot <= r.End && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr
		}
	}
	return ""
}

func nodeID(t testing.TB, rc *redis.Client) string {
	t.Helper()
	id, err := rc.Do(context.Background(), "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatalf("CLUSTER MYID on %s: %v", rc.Options().Addr, err)
	}
	return id
}

// ManualFailover makes the replica at addr take its master's place with
// CLUSTER FAILOVER (coordinated: the master stops taking writes until the
// replica has them all), and returns once the replica serves as master,
// the old master replicates from it, in sync, and every node reports the
// cluster ok.
func (c *RedisCluster) ManualFailover(t testing.TB, replica string) {
	t.Helper()
	ctx := context.Background()
	rc := redis.NewClient(&redis.Options{Addr: replica})
	defer rc.Close()
	var old string
	if info, err := rc.Info(ctx, "replication").Result(); err == nil {
		old = infoField(info, "master_host") + ":" + infoField(info, "master_port")
	}
	// The master ignores a manual failover asked by a node it does not yet
	// know as its replica (just after roles changed, say).
	Eventually(t, 30*time.Second, old+" knowing "+replica+" as its replica", func() error {
		if !slices.Contains(c.ReplicasOf(t, old), replica) {
			return fmt.Errorf("its replicas: %v", c.ReplicasOf(t, old))
		}
		return nil
	})
	if err := rc.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER on %s: %v", replica, err)
	}
	Eventually(t, 30*time.Second, replica+" serving as master, "+old+" replicating from it", func() error {
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if infoField(info, "role") != "master" {
			return fmt.Errorf("%s is still a %s", replica, infoField(info, "role"))
		}
		return replicaInSync(ctx, old)
	})
	// And every node sees the cluster whole again: a node that flagged
	// another as failing meanwhile answers CLUSTERDOWN until it does.
	c.waitHealthy(t)
}

// replicaInSync says why the server at addr is not a replica in sync with
// its master (nil once it is).
func replicaInSync(ctx context.Context, addr string) error {
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	info, err := rc.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if infoField(info, "role") != "slave" || infoField(info, "master_link_status") != "up" {
		return fmt.Errorf("%s: role %s, link to its master %q", addr, infoField(info, "role"), infoField(info, "master_link_status"))
	}
	return nil
}

// infoField returns a field of an INFO answer ("" if absent).
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// Failover makes the Sentinels promote a replica (SENTINEL FAILOVER: the
// master is demoted once the replica has caught up) and returns once every
// Sentinel names the new master and the old master replicates from it, in
// sync. It returns the new master's address.
func (s *RedisSentinel) Failover(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddrs[0]})
	defer sc.Close()
	// A failover already under way (the Sentinels' own, after a crash of
	// the master the campaign made) is answered INPROG: ask again once it
	// is over, from the master it left. An accepted failover may also be
	// given up by the Sentinels (no replica good enough yet: one still
	// syncing after that crash), the master left in place: ask again.
	var oldAddr, now string
	Eventually(t, 60*time.Second, "a failover carried out by every Sentinel", func() error {
		old, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
		if err != nil {
			t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME: %v", err)
		}
		oldAddr = old[0] + ":" + old[1]
		if err := sc.Failover(ctx, s.MasterName).Err(); err != nil {
			if !strings.Contains(err.Error(), "INPROG") && !strings.Contains(err.Error(), "NOGOODSLAVE") {
				t.Fatalf("SENTINEL FAILOVER: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
			return err
		}
		var named error
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if now, named = s.namedInstead(ctx, oldAddr); named == nil {
				return nil
			}
		}
		return fmt.Errorf("the failover from %s was not carried out: %w", oldAddr, named)
	})
	Eventually(t, 30*time.Second, oldAddr+" replicating from "+now+", in sync", func() error { return replicaInSync(ctx, oldAddr) })
	return now
}

// namedInstead returns the master every Sentinel names, if they all name
// one and it is not oldAddr.
func (s *RedisSentinel) namedInstead(ctx context.Context, oldAddr string) (string, error) {
	var now string
	for _, addr := range s.SentinelAddrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: addr})
		m, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
		c.Close()
		if err != nil {
			return "", err
		}
		if a := m[0] + ":" + m[1]; a == oldAddr || (now != "" && a != now) {
			return "", fmt.Errorf("sentinel %s names %s", addr, a)
		} else {
			now = a
		}
	}
	return now, nil
}

// CrashMaster kills the master at addr with SIGKILL, waits until its
// replica has taken its place (the cluster's node timeout, then an
// election), and starts it again: without its data (no persistence), it
// rejoins as the new master's replica; CrashMaster returns once it is in
// sync. (Started before the promotion, an empty master would keep its
// slots and lose every record on them.)
func (c *RedisCluster) CrashMaster(t testing.TB, addr string) {
	t.Helper()
	ctx := context.Background()
	replicas := c.ReplicasOf(t, addr)
	if len(replicas) == 0 {
		t.Fatalf("%s has no replica to take its place", addr)
	}
	c.Node(t, addr).Kill(t)
	Eventually(t, 30*time.Second, "a replica of "+addr+" serving as master", func() error {
		for _, r := range replicas {
			rc := redis.NewClient(&redis.Options{Addr: r})
			info, err := rc.Info(ctx, "replication").Result()
			state, _ := rc.ClusterInfo(ctx).Result()
			rc.Close()
			if err == nil && infoField(info, "role") == "master" && strings.Contains(state, "cluster_state:ok") {
				return nil
			}
		}
		return fmt.Errorf("none of %v yet", replicas)
	})
	c.Node(t, addr).Start(t)
	Eventually(t, 30*time.Second, addr+" back as a replica, in sync", func() error { return replicaInSync(ctx, addr) })
}

// CrashMaster kills the master with SIGKILL, waits until the Sentinels
// name a replica in its place, and starts it again: without its data (no
// persistence), it is told by the Sentinels to follow the new master;
// CrashMaster returns once it does, in sync.
func (s *RedisSentinel) CrashMaster(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddrs[0]})
	defer sc.Close()
	m, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		t.Fatalf("SENTINEL GET-MASTER-ADDR-BY-NAME: %v", err)
	}
	old := m[0] + ":" + m[1]
	s.Node(t, old).Kill(t)
	Eventually(t, 30*time.Second, "the Sentinels naming a new master", func() error {
		m, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
		if err == nil && m[0]+":"+m[1] == old {
			err = fmt.Errorf("still %s", old)
		}
		return err
	})
	s.Node(t, old).Start(t)
	Eventually(t, 60*time.Second, old+" back as a replica, in sync", func() error { return replicaInSync(ctx, old) })
}
