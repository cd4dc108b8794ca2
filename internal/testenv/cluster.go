package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a Redis Cluster of real redis-server processes on
// loopback, torn down when the test ends.
type RedisCluster struct {
	// Addrs are the nodes' addresses, masters first (as created).
	Addrs []string
	nodes map[string]*RedisServer
}

// StartRedisCluster starts masters×(1+replicas) redis-server processes
// with cluster mode on free loopback ports, joins them with
// `redis-cli --cluster create`, and waits until every slot is served and
// every replica is in sync. Replicas fail over whatever their data's age
// (validity factor 0) within a second of their master's death.
func StartRedisCluster(t testing.TB, masters, replicas int) *RedisCluster {
	t.Helper()
	skipShort(t, "a Redis Cluster")
	c := &RedisCluster{nodes: map[string]*RedisServer{}}
	for range masters * (1 + replicas) {
		n := StartRedisServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
			"--repl-diskless-sync-delay", "0", "--save", "", "--appendonly", "no")
		c.nodes[n.Addr] = n
		c.Addrs = append(c.Addrs, n.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitHealthy(t)
	return c
}

// Node returns the node at addr.
func (c *RedisCluster) Node(t testing.TB, addr string) *RedisServer {
	t.Helper()
	n, ok := c.nodes[addr]
	if !ok {
		t.Fatalf("no cluster node at %s", addr)
	}
	return n
}

// Client returns a cluster client that does not resend commands (see
// redisstore.Config.Client), closed when the test ends.
func (c *RedisCluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, MaxRetries: -1})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// waitHealthy waits until every node reports cluster_state:ok and every
// replica is in sync with its master.
func (c *RedisCluster) waitHealthy(t testing.TB) {
	t.Helper()
	for _, addr := range c.Addrs {
		rc := redis.NewClient(&redis.Options{Addr: addr})
		Eventually(t, 30*time.Second, "cluster node "+addr+" healthy", func() error {
			info, err := rc.ClusterInfo(context.Background()).Result()
			if err != nil {
				return err
			}
			repl, err := rc.Info(context.Background(), "replication").Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") ||
				!(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				return fmt.Errorf("not yet:\n%s\n%s", info, repl)
			}
			return nil
		})
		rc.Close()
	}
}

// RedisSentinel is a Redis master with two replicas watched by three
// Sentinels, real processes on loopback, torn down when the test ends.
// (Two replicas, so that after a failover the promoted one still has a
// replica: a WAIT for one replica can succeed again without restarting
// the dead master — which, restarted empty without persistence before
// every Sentinel agreed on the promotion, could wipe the others.)
type RedisSentinel struct {
	MasterName    string
	Master        string // the first master's address
	Replicas      []string
	SentinelAddrs []string
	nodes         map[string]*RedisServer
}

// StartRedisSentinel starts the master, two replicas and three Sentinels
// (quorum 2, down after 1s) and waits until the replicas are in sync and
// the Sentinels know them.
func StartRedisSentinel(t testing.TB) *RedisSentinel {
	t.Helper()
	skipShort(t, "a Redis master, its replicas and Sentinels")
	dir := t.TempDir() // the Sentinels' configuration files, which they rewrite
	s := &RedisSentinel{MasterName: "idemmaster", nodes: map[string]*RedisServer{}}
	start := func(args ...string) string {
		n := StartRedisServer(t, args...)
		s.nodes[n.Addr] = n
		return n.Addr
	}
	s.Master = start("--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0")
	host, port, _ := strings.Cut(s.Master, ":")
	for range 2 {
		s.Replicas = append(s.Replicas, start("--save", "", "--appendonly", "no", "--replicaof", host, port))
	}
	for i := range 3 {
		conf := filepath.Join(dir, fmt.Sprintf("sentinel-%d.conf", i))
		body := fmt.Sprintf("sentinel monitor %s %s %s 2\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
			s.MasterName, host, port, s.MasterName, s.MasterName)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		s.SentinelAddrs = append(s.SentinelAddrs, start(conf, "--sentinel"))
	}
	// Wait until the replica is in sync and a Sentinel sees it (so a
	// failover can promote it).
	for _, r := range s.Replicas {
		rc := redis.NewClient(&redis.Options{Addr: r})
		Eventually(t, 30*time.Second, "replica "+r+" in sync", func() error {
			info, err := rc.Info(context.Background(), "replication").Result()
			if err == nil && !strings.Contains(info, "master_link_status:up") {
				err = fmt.Errorf("not yet:\n%s", info)
			}
			return err
		})
		rc.Close()
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddrs[0]})
	defer sc.Close()
	Eventually(t, 30*time.Second, "the Sentinels see the replicas", func() error {
		reps, err := sc.Replicas(context.Background(), s.MasterName).Result()
		if err == nil && len(reps) != len(s.Replicas) {
			err = fmt.Errorf("%d of %d replicas known", len(reps), len(s.Replicas))
		}
		return err
	})
	return s
}

// Client returns a Sentinel-aware client that does not resend commands.
func (s *RedisSentinel) Client(t testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// Node returns the master, replica or Sentinel at addr.
func (s *RedisSentinel) Node(t testing.TB, addr string) *RedisServer {
	t.Helper()
	n, ok := s.nodes[addr]
	if !ok {
		t.Fatalf("no node at %s", addr)
	}
	return n
}

// RedisServer is one redis-server process on loopback that a test can
// kill and start again on the same address and directory.
type RedisServer struct {
	Addr string
	args []string
	log  string
	proc *server   // nil when not running
	held heldPorts // while killed: its ports, for Start
}

// StartRedisServer starts redis-server with extra arguments (persistence,
// cluster or replication settings; a configuration file first, as
// redis-server wants it) on a free port, in a directory of its own. A
// cluster node gets a free port for its bus too (Redis's default, the
// port + 10,000, may be taken).
//
// A free port is only free when it is chosen: another process may bind it
// before redis-server does, and redis-server then exits. So a server that
// exits before it answers is started again on new ports, up to five
// times; a server is taken as started only when the process that answers
// on the port is the one started (INFO's process_id).
func StartRedisServer(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	return startRedisServer(t, freePort, extra...)
}

func startRedisServer(t testing.TB, pick func(testing.TB) int, extra ...string) *RedisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		Need(t, "redis-server", "PATH", err)
	}
	var conf []string
	if len(extra) > 0 && !strings.HasPrefix(extra[0], "--") {
		conf, extra = extra[:1], extra[1:]
	}
	cluster := slices.Contains(extra, "--cluster-enabled")
	dir := t.TempDir()
	r := &RedisServer{log: filepath.Join(dir, "redis.log")}
	t.Cleanup(func() { r.stop(); r.held.release() })
	startOnFreePorts(t, "redis-server", func(int) error {
		port := pick(t)
		r.Addr = "127.0.0.1:" + strconv.Itoa(port)
		r.args = append(append(slices.Clone(conf), "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--logfile", r.log), extra...)
		if cluster {
			r.args = append(r.args, "--cluster-port", strconv.Itoa(pick(t)))
		}
		return r.start()
	})
	return r
}

// Start starts the server again on its address, waiting until it loaded
// its data.
func (r *RedisServer) Start(t testing.TB) {
	t.Helper()
	err := r.start()
	r.held.release()
	r.held = nil
	if err != nil {
		t.Fatalf("redis-server on %s: %v", r.Addr, err)
	}
}

// start starts the process and waits until it answers INFO as itself, not
// loading its dataset (INFO answers while the server loads its files, and
// every other command is refused LOADING until it is done), or exits, or
// 30 s pass.
func (r *RedisServer) start() error {
	proc, err := startServer(exec.Command("redis-server", r.args...), r.log, filepath.Dir(r.log))
	if err != nil {
		return err
	}
	rc := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rc.Close()
	self := "process_id:" + strconv.Itoa(proc.cmd.Process.Pid) + "\r\n"
	err = proc.waitReady(30*time.Second, func() error {
		info, err := rc.Info(context.Background(), "server", "persistence").Result()
		switch {
		case err != nil:
		case !strings.Contains(info, self):
			err = errors.New("another server answers on the port")
		case strings.Contains(info, "loading:1\r\n"): // a sentinel has no persistence section
			err = errors.New("still loading its dataset")
		}
		return err
	})
	if err == nil {
		r.proc = proc
	}
	return err
}

// stop kills the process, if any, and waits for it.
func (r *RedisServer) stop() {
	if r.proc != nil {
		r.proc.stop()
		r.proc = nil
	}
}

// Kill stops the server with SIGKILL; no other socket takes its ports
// until Start.
func (r *RedisServer) Kill(t testing.TB) {
	t.Helper()
	r.stop()
	addrs := []string{r.Addr}
	if i := slices.Index(r.args, "--cluster-port"); i >= 0 && i+1 < len(r.args) {
		addrs = append(addrs, "127.0.0.1:"+r.args[i+1])
	}
	r.held = holdPorts(addrs...)
}

// ReplicasOf returns the addresses of the replicas of the master at addr,
// as the cluster reports them (CLUSTER NODES).
func (c *RedisCluster) ReplicasOf(t testing.TB, master string) []string {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: master})
	defer rc.Close()
	nodes, err := rc.ClusterNodes(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && strings.Contains(f[2], "myself") {
			id = f[0]
		}
	}
	var out []string
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[3] == id {
			addr, _, _ := strings.Cut(f[1], "@")
			out = append(out, addr)
		}
	}
	return out
}

// Pause stops the server (SIGSTOP) until Resume: a replica that falls
// behind.
func (r *RedisServer) Pause(t testing.TB) { r.signal(t, syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (r *RedisServer) Resume(t testing.TB) { r.signal(t, syscall.SIGCONT) }

func (r *RedisServer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if r.proc == nil {
		t.Fatalf("redis-server %s is not running", r.Addr)
	}
	if err := r.proc.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// StartFillableRedis starts a redis-server of its own (no persistence,
// noeviction) for a fault campaign, with fill and unfill: fill sets its
// maxmemory below what it holds — a full server, which refuses writes
// that add memory — and unfill lifts the limit. A server of its own,
// because filling the shared one would fail the tests running beside.
func StartFillableRedis(t testing.TB) (srv *RedisServer, fill, unfill func()) {
	t.Helper()
	return startFillableRedis(t, "--appendonly", "no")
}

// StartDurableFillableRedis is StartFillableRedis with the append-only file
// written and fsynced before each answer (appendfsync always): killed with
// SIGKILL (Kill) and started again (Start), it has every write it
// acknowledged.
func StartDurableFillableRedis(t testing.TB) (srv *RedisServer, fill, unfill func()) {
	t.Helper()
	return startFillableRedis(t, "--appendonly", "yes", "--appendfsync", "always")
}

func startFillableRedis(t testing.TB, persistence ...string) (srv *RedisServer, fill, unfill func()) {
	t.Helper()
	srv = StartRedisServer(t, append([]string{"--save", "", "--maxmemory-policy", "noeviction"}, persistence...)...)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { admin.Close() })
	maxmemory := func(v string) func() {
		return func() {
			if err := admin.ConfigSet(context.Background(), "maxmemory", v).Err(); err != nil {
				t.Errorf("CONFIG SET maxmemory %s: %v", v, err)
			}
		}
	}
	return srv, maxmemory("1"), maxmemory("0")
}
