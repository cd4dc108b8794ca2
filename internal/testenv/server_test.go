package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

// TestRedisServerStartsAgainOnATakenPort: a port that was free when
// chosen and is taken before redis-server binds it (another test's server,
// a client's ephemeral port) makes redis-server exit. The server is
// started again on other ports, and the server then used is the one
// started, not the port's other owner. Both the client port and a cluster
// node's bus port are taken in turn.
func TestRedisServerStartsAgainOnATakenPort(t *testing.T) {
	for _, c := range []struct {
		name  string
		args  []string
		taken int // which pick (0 the port, 1 the cluster bus port) returns the taken port
	}{
		{"Port", []string{"--save", ""}, 0},
		{"ClusterBusPort", []string{"--cluster-enabled", "yes", "--save", ""}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A Redis-speaking listener would fool a PING; a second
			// redis-server holds the port.
			owner := StartRedisServer(t, "--save", "")
			_, ownerPort, _ := net.SplitHostPort(owner.Addr)
			picks := 0
			pick := func(t testing.TB) int {
				picks++
				if picks-1 == c.taken {
					p, _ := net.LookupPort("tcp", ownerPort)
					return p
				}
				return freePort(t)
			}
			r := startRedisServer(t, pick, c.args...)
			if r.Addr == owner.Addr {
				t.Fatalf("the server took the taken address %s", r.Addr)
			}
			if want := 2 * (1 + c.taken); picks != want {
				t.Fatalf("%d port picks, want %d: the server was not started again once", picks, want)
			}
			rc := redis.NewClient(&redis.Options{Addr: r.Addr})
			defer rc.Close()
			info, err := rc.Info(context.Background(), "server").Result()
			if err != nil {
				t.Fatal(err)
			}
			if want := "process_id:"; !strings.Contains(info, want) || r.proc == nil ||
				!strings.Contains(info, want+strconv.Itoa(r.proc.cmd.Process.Pid)+"\r\n") {
				t.Fatalf("the server answering on %s is not the one started", r.Addr)
			}
			r.Kill(t)
			r.Start(t) // and it starts again on its own address
		})
	}
}

// TestPgBouncerStartsAgainOnATakenPort: PgBouncer, given a port another
// server holds, exits; the start goes on to another port.
func TestPgBouncerStartsAgainOnATakenPort(t *testing.T) {
	ProbePostgres(t)
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		Need(t, "pgbouncer", "PATH", err)
	}
	taken := takenPort(t)
	dir, err := os.MkdirTemp("", "idem-pgbouncer-") // not t.TempDir: PgBouncer runs as postgres
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, err = startPgBouncer(t, bin, dir, taken, target{"127.0.0.1", 5432, "test"})
	var exit *earlyExitError
	if !errors.As(err, &exit) {
		t.Fatalf("pgbouncer on a taken port: %v, want an early exit", err)
	}
	addr, err := startPgBouncer(t, bin, dir, freePort(t), target{"127.0.0.1", 5432, "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := listening(addr); err != nil {
		t.Fatal(err)
	}
}

// TestNATSServerExitsOnATakenPort: a NATS server whose route port is taken
// exits, and the cluster start sees it as an early exit (and so starts
// the cluster again), not as a server ready.
func TestNATSServerExitsOnATakenPort(t *testing.T) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		Need(t, "nats-server", "PATH", err)
	}
	taken := takenPort(t)
	picks := 0
	pick := func(t testing.TB) int {
		picks++
		if picks == 2 { // the first server's route port
			return taken
		}
		return freePort(t)
	}
	c := &NATSCluster{}
	err = c.start(t, pick, bin, t.TempDir(), 1)
	for _, p := range c.procs {
		p.stop()
	}
	var exit *earlyExitError
	if !errors.As(err, &exit) {
		t.Fatalf("a server on a taken route port: %v, want an early exit", err)
	}
}

// takenPort returns a port a redis-server holds until the test ends.
func takenPort(t *testing.T) int {
	owner := StartRedisServer(t, "--save", "")
	_, port, _ := net.SplitHostPort(owner.Addr)
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNATSServerCrash: a message JetStream acknowledged is still in the
// stream after the server was killed with SIGKILL and started again on its
// port and store, and clients reach it there.
func TestNATSServerCrash(t *testing.T) {
	s := StartNATSServer(t)
	publish := func(subject string) {
		t.Helper()
		nc, err := nats.Connect(s.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx := context.Background()
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "CRASH", Subjects: []string{"crash.>"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, subject, []byte(subject)); err != nil {
			t.Fatal(err)
		}
		info, err := js.Stream(ctx, "CRASH")
		if err != nil {
			t.Fatal(err)
		}
		if got := info.CachedInfo().State.Msgs; got != map[string]uint64{"crash.1": 1, "crash.2": 2}[subject] {
			t.Fatalf("after publishing %s the stream holds %d messages", subject, got)
		}
	}
	publish("crash.1")
	s.Crash(t)
	publish("crash.2")
}

// TestServersOutliveNoKilledTest: a test binary killed with SIGKILL (as at
// a CI timeout) runs no cleanup; the servers it started — a Redis, and a
// PostgreSQL whose backends each run in a session of their own — must not
// outlive it, nor their directories.
func TestServersOutliveNoKilledTest(t *testing.T) {
	if os.Getenv("IDEM_TESTENV_KILLED_CHILD") == "1" {
		r := StartRedisServer(t)
		p := StartPostgres(t)
		fmt.Printf("SERVERS %d %s %d %s\n", r.proc.cmd.Process.Pid, filepath.Dir(r.log), p.proc.cmd.Process.Pid, p.dir)
		select {} // until killed
	}
	child := StartChild(t, "TestServersOutliveNoKilledTest", "IDEM_TESTENV_KILLED_CHILD=1")
	var redisPid, pgPid int
	var redisDir, pgDir string
	line := child.WaitFor(t, "SERVERS ")
	if _, err := fmt.Sscanf(line, "SERVERS %d %s %d %s", &redisPid, &redisDir, &pgPid, &pgDir); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	pgBackends := liveProcesses(func(_, ppid, _ int) bool { return ppid == pgPid })
	if len(pgBackends) == 0 {
		t.Fatal("the PostgreSQL server has no processes besides the postmaster")
	}
	child.Kill(t)
	watched := append([]int{redisPid, pgPid}, pgBackends...)
	waitGone(func(pid, _, _ int) bool { return slices.Contains(watched, pid) })
	if left := liveProcesses(func(pid, _, _ int) bool { return slices.Contains(watched, pid) }); len(left) > 0 {
		t.Fatalf("processes %v of the killed test's servers still run 10 s after it", left)
	}
	for _, dir := range []string{redisDir, pgDir} {
		Eventually(t, 10*time.Second, "the killed test's server directory removed", func() error {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%s is still there (%v)", dir, err)
			}
			return nil
		})
	}
}

// TestKilledServersKeepTheirPorts: between a Kill and the Start that
// brings a server back on its port, no other socket can take the port —
// here a connection bound to it, as one given the port as its ephemeral
// port would be (the Start then failed: the port was taken) — connections
// to it are refused, and the server starts again on it.
func TestKilledServersKeepTheirPorts(t *testing.T) {
	elsewhere := serveLoopback(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	takeAndDial := func(t *testing.T, addr string) {
		t.Helper()
		local, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := (&net.Dialer{LocalAddr: local}).Dial("tcp", elsewhere); err == nil {
			c.Close()
			t.Fatalf("a connection took the killed server's address %s", addr)
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Fatalf("%s accepted a connection while its server was down", addr)
		}
	}
	t.Run("Redis", func(t *testing.T) {
		r := StartRedisServer(t, "--save", "")
		r.Kill(t)
		takeAndDial(t, r.Addr)
		r.Start(t)
		rc := redis.NewClient(&redis.Options{Addr: r.Addr})
		defer rc.Close()
		if err := rc.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Postgres", func(t *testing.T) {
		ProbePostgres(t)
		p := StartPostgres(t)
		p.Kill()
		takeAndDial(t, p.addr)
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		c, err := pgx.Connect(context.Background(), p.URL)
		if err != nil {
			t.Fatal(err)
		}
		c.Close(context.Background())
	})
}
