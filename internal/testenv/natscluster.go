package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
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
	procs []*exec.Cmd
}

// StartNATSCluster starts n JetStream servers routed to each other and
// waits until the cluster has a JetStream meta leader.
func StartNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		Need(t, "nats-server (for a JetStream cluster)", "PATH", err)
	}
	dir := t.TempDir()
	c := &NATSCluster{}
	t.Cleanup(func() {
		for _, p := range c.procs {
			if p != nil {
				_ = p.Process.Kill()
				_ = p.Wait()
			}
		}
	})
	ports, routes := make([]int, n), make([]string, n)
	for i := range n {
		ports[i] = freePort(t)
		routes[i] = "nats://127.0.0.1:" + strconv.Itoa(freePort(t))
	}
	for i := range n {
		cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(ports[i]), "-js",
			"-sd", filepath.Join(dir, fmt.Sprintf("n%d", i)), "-n", fmt.Sprintf("idem-n%d", i),
			"--cluster_name", "idem", "--cluster", routes[i], "--routes", strings.Join(routes, ","),
			"-l", filepath.Join(dir, fmt.Sprintf("n%d.log", i)))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c.procs = append(c.procs, cmd)
		c.URLs = append(c.URLs, "nats://127.0.0.1:"+strconv.Itoa(ports[i]))
	}
	for _, u := range c.URLs {
		waitPort(t, strings.TrimPrefix(u, "nats://"))
	}
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
	if err := c.procs[i].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.procs[i].Wait()
	c.procs[i] = nil
}
