package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	procs map[string]*exec.Cmd
}

// StartRedisCluster starts masters×(1+replicas) redis-server processes
// with cluster mode on free loopback ports, joins them with
// `redis-cli --cluster create`, and waits until every slot is served.
func StartRedisCluster(t testing.TB, masters, replicas int) *RedisCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		Need(t, "redis-server (for a Redis Cluster)", "PATH", err)
	}
	dir := t.TempDir()
	c := &RedisCluster{procs: map[string]*exec.Cmd{}}
	t.Cleanup(func() {
		for _, p := range c.procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	})
	for range masters * (1 + replicas) {
		port := freePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0", "--dir", dir, "--save", "", "--appendonly", "no",
			"--logfile", filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c.procs[addr] = cmd
		c.Addrs = append(c.Addrs, addr)
		waitPort(t, addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitHealthy(t)
	return c
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
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range c.Addrs {
		rc := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := rc.ClusterInfo(context.Background()).Result()
			repl, rerr := rc.Info(context.Background(), "replication").Result()
			if err == nil && rerr == nil && strings.Contains(info, "cluster_state:ok") &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				t.Fatalf("cluster node %s not healthy: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond) // the cluster bus converges on its own
		}
		rc.Close()
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func waitPort(t testing.TB, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not start: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // the process is starting
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
	procs         map[string]*exec.Cmd
	args          map[string][]string
}

// StartRedisSentinel starts the master, two replicas and three Sentinels
// (quorum 2, down after 1s) and waits until the replicas are in sync and
// the Sentinels know them.
func StartRedisSentinel(t testing.TB) *RedisSentinel {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		Need(t, "redis-server (for Redis Sentinel)", "PATH", err)
	}
	dir := t.TempDir()
	s := &RedisSentinel{MasterName: "idemmaster", procs: map[string]*exec.Cmd{}, args: map[string][]string{}}
	t.Cleanup(func() {
		for _, p := range s.procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	})
	start := func(args ...string) string {
		port := freePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		s.args[addr] = append(args, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--logfile", filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)))
		s.run(t, addr)
		return addr
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
	deadline := time.Now().Add(30 * time.Second)
	for _, r := range s.Replicas {
		rc := redis.NewClient(&redis.Options{Addr: r})
		for {
			info, err := rc.Info(context.Background(), "replication").Result()
			if err == nil && strings.Contains(info, "master_link_status:up") {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				t.Fatalf("replica %s did not sync: %v %s", r, err, info)
			}
			time.Sleep(50 * time.Millisecond) // the replica syncs on its own schedule
		}
		rc.Close()
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddrs[0]})
	defer sc.Close()
	for {
		reps, err := sc.Replicas(context.Background(), s.MasterName).Result()
		if err == nil && len(reps) == len(s.Replicas) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Sentinels do not see the replica: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // Sentinels discover replicas on their own schedule
	}
	return s
}

// Client returns a Sentinel-aware client that does not resend commands.
func (s *RedisSentinel) Client(t testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

func (s *RedisSentinel) run(t testing.TB, addr string) {
	cmd := exec.Command("redis-server", s.args[addr]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.procs[addr] = cmd
	waitPort(t, addr)
}

// KillMaster kills the first master's process with SIGKILL.
func (s *RedisSentinel) KillMaster(t testing.TB) {
	t.Helper()
	p := s.procs[s.Master]
	if err := p.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.Wait()
	delete(s.procs, s.Master)
}

// Kill stops the node at addr with SIGKILL.
func (c *RedisCluster) Kill(t testing.TB, addr string) {
	t.Helper()
	p, ok := c.procs[addr]
	if !ok {
		t.Fatalf("no cluster node at %s", addr)
	}
	if err := p.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.Wait()
	delete(c.procs, addr)
}

// RedisServer is one redis-server process on loopback that a test can
// kill and start again on the same address and directory.
type RedisServer struct {
	Addr string
	args []string
	proc *exec.Cmd
}

// StartRedisServer starts redis-server with extra arguments (persistence
// settings) on a free port, in a directory of its own.
func StartRedisServer(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		Need(t, "redis-server", "PATH", err)
	}
	dir := t.TempDir()
	port := freePort(t)
	r := &RedisServer{Addr: "127.0.0.1:" + strconv.Itoa(port),
		args: append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--logfile", filepath.Join(dir, "redis.log")}, extra...)}
	r.Start(t)
	t.Cleanup(func() {
		if r.proc != nil {
			_ = r.proc.Process.Kill()
			_ = r.proc.Wait()
		}
	})
	return r
}

// Start starts the server (again), waiting until it loaded its data.
func (r *RedisServer) Start(t testing.TB) {
	t.Helper()
	r.proc = exec.Command("redis-server", r.args...)
	if err := r.proc.Start(); err != nil {
		t.Fatal(err)
	}
	waitPort(t, r.Addr)
	rc := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for rc.Ping(context.Background()).Err() != nil { // LOADING while it reads its files
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not load its data")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL.
func (r *RedisServer) Kill(t testing.TB) {
	t.Helper()
	_ = r.proc.Process.Kill()
	_ = r.proc.Wait()
	r.proc = nil
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

// Pause stops the node at addr (SIGSTOP) until Resume: a replica that
// falls behind.
func (c *RedisCluster) Pause(t testing.TB, addr string) { signal(t, c.procs[addr], syscall.SIGSTOP) }

// Resume continues a paused node (SIGCONT).
func (c *RedisCluster) Resume(t testing.TB, addr string) { signal(t, c.procs[addr], syscall.SIGCONT) }

// Pause stops the node at addr (SIGSTOP) until Resume.
func (s *RedisSentinel) Pause(t testing.TB, addr string) { signal(t, s.procs[addr], syscall.SIGSTOP) }

// Resume continues a paused node (SIGCONT).
func (s *RedisSentinel) Resume(t testing.TB, addr string) { signal(t, s.procs[addr], syscall.SIGCONT) }

func signal(t testing.TB, p *exec.Cmd, sig syscall.Signal) {
	t.Helper()
	if p == nil {
		t.Fatal("no such process")
	}
	if err := p.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}
