package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSCluster is a JetStream cluster of nats-server processes with routes,
// on loopback, torn down when the test ends.
type NATSCluster struct {
	URLs  []string // the client URLs, one per server
	procs []*server
}

// start starts n servers routed to each other on free ports and waits
// until each listens.
func (c *NATSCluster) start(t testing.TB, pick func(testing.TB) int, bin, dir string, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ports, routes := make([]int, n), make([]string, n)
	for i := range n {
		ports[i] = pick(t)
		routes[i] = "nats://127.0.0.1:" + strconv.Itoa(pick(t))
	}
	for i := range n {
		log := filepath.Join(dir, fmt.Sprintf("n%d.log", i))
		cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(ports[i]), "-js",
			"-sd", filepath.Join(dir, fmt.Sprintf("n%d", i)), "-n", fmt.Sprintf("idem-n%d", i),
			"--cluster_name", "idem", "--cluster", routes[i], "--routes", strings.Join(routes, ","),
			"-l", log)
		p, err := startServer(cmd, log, dir)
		if err != nil {
			return err
		}
		c.procs = append(c.procs, p)
		c.URLs = append(c.URLs, "nats://127.0.0.1:"+strconv.Itoa(ports[i]))
	}
	for i, u := range c.URLs {
		addr := strings.TrimPrefix(u, "nats://")
		p := c.procs[i]
		if err := p.waitReady(10*time.Second, func() error {
			// nats-server says it is ready, and answers on its client port,
			// before it binds its route port: a server whose route port is
			// taken exits a moment after. The route listener's line comes
			// after that bind.
			if err := p.logSays("Listening for route connections on "); err != nil {
				return err
			}
			return listening(addr)
		}); err != nil {
			return err
		}
	}
	return nil
}

// StartNATSCluster starts n JetStream servers routed to each other and
// waits until the cluster has a JetStream meta leader.
func StartNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	skipShort(t, "a NATS cluster")
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		Need(t, "nats-server (for a JetStream cluster)", "PATH", err)
	}
	dir := t.TempDir()
	c := &NATSCluster{}
	t.Cleanup(func() {
		for _, p := range c.procs {
			if p != nil {
				p.stop()
			}
		}
	})
	// A server that exits before it listens has the whole cluster started
	// again on new ports, with a fresh store.
	startOnFreePorts(t, "nats-server", func(attempt int) error {
		err := c.start(t, freePort, bin, filepath.Join(dir, strconv.Itoa(attempt)), n)
		if err != nil {
			for _, p := range c.procs {
				p.stop()
			}
			c.procs, c.URLs = nil, nil
		}
		return err
	})
	nc, err := nats.Connect(strings.Join(c.URLs, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// A meta leader answers AccountInfo before it knows every peer; a
	// stream replicated on every server is placed only once it does
	// ("no suitable peers for placement" otherwise).
	Eventually(t, 30*time.Second, "a JetStream cluster that places a stream on every server", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDEM_TESTENV_PROBE", Subjects: []string{"idem.testenv.probe"}, Replicas: len(c.URLs)}); err != nil {
			return err
		}
		return js.DeleteStream(ctx, "IDEM_TESTENV_PROBE")
	})
	return c
}

// Kill stops server i with SIGKILL.
func (c *NATSCluster) Kill(t testing.TB, i int) {
	t.Helper()
	if c.procs[i] == nil {
		t.Fatalf("nats-server %d is not running", i)
	}
	c.procs[i].stop()
	c.procs[i] = nil
}

// NATSServer is one JetStream server on loopback, with a store of its own,
// that a test can kill (SIGKILL) and start again on the same port and
// store: a broker that crashes and comes back.
type NATSServer struct {
	URL    string // nats://127.0.0.1:PORT
	bin    string
	dir    string
	args   []string
	starts int
	proc   *server
}

// StartNATSServer starts a JetStream server on a free port, with extra
// arguments for nats-server (say "--auth", TOKEN), and waits until it is
// ready; it is killed when the test ends.
func StartNATSServer(t testing.TB, extra ...string) *NATSServer {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		Need(t, "nats-server", "PATH", err)
	}
	s := &NATSServer{bin: bin, dir: t.TempDir()}
	t.Cleanup(s.stop)
	startOnFreePorts(t, "nats-server", func(int) error {
		port := strconv.Itoa(freePort(t))
		s.URL = "nats://127.0.0.1:" + port
		s.args = append([]string{"-a", "127.0.0.1", "-p", port, "-js", "-sd", filepath.Join(s.dir, "store")}, extra...)
		return s.start()
	})
	return s
}

// start starts the process, with a log of its own, and waits until it says
// it is ready (JetStream has recovered its streams by then) and listens.
func (s *NATSServer) start() error {
	s.starts++
	log := filepath.Join(s.dir, fmt.Sprintf("nats-%d.log", s.starts))
	p, err := startServer(exec.Command(s.bin, append(slices.Clone(s.args), "-l", log)...), log, s.dir)
	if err != nil {
		return err
	}
	err = p.waitReady(30*time.Second, func() error {
		if err := p.logSays("Server is ready"); err != nil {
			return err
		}
		return listening(strings.TrimPrefix(s.URL, "nats://"))
	})
	if err == nil {
		s.proc = p
	}
	return err
}

func (s *NATSServer) stop() {
	if s.proc != nil {
		s.proc.stop()
		s.proc = nil
	}
}

// Crash kills the server with SIGKILL and starts it again on its port and
// store, waiting until it is ready. It fails t if the server does not come
// back; call it from the test's goroutine, or Restart.
func (s *NATSServer) Crash(t testing.TB) {
	t.Helper()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
}

// Restart is Crash for any goroutine: it returns why the server did not
// come back.
func (s *NATSServer) Restart() error {
	s.stop()
	held := holdPorts(strings.TrimPrefix(s.URL, "nats://"))
	err := s.start()
	held.release()
	if err != nil {
		return fmt.Errorf("nats-server on %s, after the kill: %w", s.URL, err)
	}
	return nil
}

// Stream creates a stream named name taking subject on the server,
// connecting with opts (a token, credentials), and returns it; the
// connection closes when the test ends.
func (s *NATSServer) Stream(t testing.TB, name, subject string, opts ...nats.Option) jetstream.Stream {
	t.Helper()
	nc, err := nats.Connect(s.URL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	return st
}
