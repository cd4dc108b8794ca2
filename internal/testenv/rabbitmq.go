package testenv

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitMQ is a RabbitMQ node of a test's own (StartRabbitMQ), which the
// test may crash: the machine's shared broker serves other tests at the
// same time.
type RabbitMQ struct {
	// URL is amqp://guest:guest@127.0.0.1:PORT/.
	URL string
	// TLSURL is amqps://guest:guest@127.0.0.1:PORT/ when the node was
	// started with TLS (StartRabbitMQTLS), else "".
	TLSURL string

	bin, dir string
	env      []string
	addr     string
	proc     *server
	starts   int
}

// rabbitmqServer is the rabbitmq-server script itself (Debian's
// /usr/sbin/rabbitmq-server wraps it to run as the rabbitmq user, in its
// home): $IDEM_TEST_RABBITMQ_SERVER, else the package's, else the PATH's.
func rabbitmqServer() (string, error) {
	for _, p := range []string{os.Getenv("IDEM_TEST_RABBITMQ_SERVER"), "/usr/lib/rabbitmq/bin/rabbitmq-server"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	return exec.LookPath("rabbitmq-server")
}

// StartRabbitMQ starts a RabbitMQ node on free ports, with its data, logs,
// configuration and Erlang cookie in a directory of the test's, and stops it
// when the test ends. It takes some seconds (Erlang boots the whole broker).
func StartRabbitMQ(t testing.TB) *RabbitMQ { return startRabbitMQ(t, nil) }

// StartRabbitMQTLS is StartRabbitMQ with a TLS listener as well (TLSURL),
// its certificate and CA from files, which wants a client certificate
// signed by that CA.
func StartRabbitMQTLS(t testing.TB, files TLSFiles) *RabbitMQ { return startRabbitMQ(t, &files) }

func startRabbitMQ(t testing.TB, tls *TLSFiles) *RabbitMQ {
	t.Helper()
	skipShort(t, "a RabbitMQ node")
	bin, err := rabbitmqServer()
	if err != nil {
		Need(t, "rabbitmq-server", "PATH", err)
	}
	r := &RabbitMQ{bin: bin, dir: t.TempDir()}
	var cookie [20]byte
	_, _ = rand.Read(cookie[:])
	if err := os.WriteFile(filepath.Join(r.dir, ".erlang.cookie"), []byte(hex.EncodeToString(cookie[:])), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	startOnFreePorts(t, "rabbitmq-server", func(attempt int) error {
		port, dist := freePort(t), freePort(t)
		r.addr = "127.0.0.1:" + strconv.Itoa(port)
		r.URL = "amqp://guest:guest@" + r.addr + "/"
		settings := "listeners.tcp.default = " + r.addr + "\n"
		if tls != nil {
			tlsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
			r.TLSURL = "amqps://guest:guest@" + tlsAddr + "/"
			settings += "listeners.ssl.default = " + tlsAddr + "\nssl_options.cacertfile = " + tls.CA +
				"\nssl_options.certfile = " + tls.Cert + "\nssl_options.keyfile = " + tls.Key +
				"\nssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n"
		}
		conf := filepath.Join(r.dir, "rabbitmq.conf")
		if err := os.WriteFile(conf, []byte(settings), 0o644); err != nil {
			return err
		}
		r.env = append(os.Environ(), "HOME="+r.dir,
			"RABBITMQ_NODENAME="+RandomName("idemtest")+"@localhost",
			"RABBITMQ_NODE_PORT="+strconv.Itoa(port), "RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
			"RABBITMQ_MNESIA_BASE="+filepath.Join(r.dir, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(r.dir, "log"),
			"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(r.dir, "enabled_plugins"),
			"RABBITMQ_CONFIG_FILE="+conf, "RABBITMQ_PID_FILE="+filepath.Join(r.dir, "pid"))
		return r.start()
	})
	return r
}

// start starts the node in a process group of its own (the script starts
// the Erlang VM as a child) and waits until it says it has started and
// takes connections.
func (r *RabbitMQ) start() error {
	r.starts++
	log := filepath.Join(r.dir, fmt.Sprintf("rabbitmq-%d.out", r.starts))
	out, err := os.Create(log)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(r.bin)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = r.env, r.dir, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p, err := startServer(cmd, log, r.dir)
	if err != nil {
		return err
	}
	err = p.waitReady(60*time.Second, func() error {
		if err := p.logSays("completed with"); err != nil {
			return err
		}
		return listening(r.addr)
	})
	if err != nil {
		killGroup(p)
		return err
	}
	r.proc = p
	return nil
}

// killGroup kills a server's whole process group with SIGKILL — the
// Erlang VM with its script — and waits for the leader and for every other
// member to be gone: a restart must not meet the dead server's last
// processes.
func killGroup(p *server) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.exited
	waitGone(func(_, _, pgrp int) bool { return pgrp == pgid })
}

// waitGone waits, up to 10 s, until no running process matches.
func waitGone(match func(pid, ppid, pgrp int) bool) {
	for deadline := time.Now().Add(10 * time.Second); len(liveProcesses(match)) > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// liveProcesses returns the running processes (not zombies: a member whose
// parent is gone is reaped by whoever adopted it, when it will) whose id,
// parent and process group match.
func liveProcesses(match func(pid, ppid, pgrp int) bool) []int {
	var pids []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 3 || fields[0] == "Z" {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		ppid, _ := strconv.Atoi(fields[1])
		pgrp, _ := strconv.Atoi(fields[2])
		if match(pid, ppid, pgrp) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (r *RabbitMQ) stop() {
	if r.proc != nil {
		killGroup(r.proc)
		r.proc = nil
	}
}

// Crash kills the node with SIGKILL and starts it again on its ports and
// data, waiting until it takes connections: durable queues and the
// persistent messages it confirmed are there again. It fails t if the node
// does not come back; call it from the test's goroutine, or Restart.
func (r *RabbitMQ) Crash(t testing.TB) {
	t.Helper()
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
}

// Restart is Crash for any goroutine: it returns why the node did not come
// back.
func (r *RabbitMQ) Restart() error {
	r.stop()
	held := holdPorts(r.addr, strings.TrimPrefix(strings.TrimSuffix(r.TLSURL, "/"), "amqps://guest:guest@"))
	err := r.start()
	held.release()
	if err != nil {
		return fmt.Errorf("rabbitmq-server on %s, after the kill: %w", r.addr, err)
	}
	return nil
}

// Ctl runs rabbitmqctl against the node (set_disk_free_limit, say) and
// returns what it printed.
func (r *RabbitMQ) Ctl(args ...string) (string, error) {
	var node string
	for _, e := range r.env {
		if n, ok := strings.CutPrefix(e, "RABBITMQ_NODENAME="); ok {
			node = n
		}
	}
	cookie, err := os.ReadFile(filepath.Join(r.dir, ".erlang.cookie"))
	if err != nil {
		return "", err
	}
	cmd := exec.Command("rabbitmqctl", append([]string{"-q", "-n", node, "--erlang-cookie", string(cookie)}, args...)...)
	cmd.Env, cmd.Dir = r.env, r.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// RabbitMQQueueView describes queue as the broker at url sees it: its
// depth and consumers, and — where rabbitmqctl can reach the node (the
// machine's own) — its unacknowledged deliveries and every channel's
// consumers, prefetch and unacknowledged count.
func RabbitMQQueueView(url, queue string) string {
	var b strings.Builder
	if conn, err := amqp.Dial(url); err != nil {
		fmt.Fprintf(&b, "dial: %v\n", err)
	} else {
		if ch, err := conn.Channel(); err == nil {
			q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
			fmt.Fprintf(&b, "queue %s: %d ready, %d consumers (%v)\n", queue, q.Messages, q.Consumers, err)
		}
		conn.Close()
	}
	ctl := func(filter bool, args ...string) {
		out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
		fmt.Fprintf(&b, "rabbitmqctl %s (%v):\n", strings.Join(args, " "), err)
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if !filter || strings.Contains(line, queue) {
				fmt.Fprintf(&b, "  %s\n", line)
			}
		}
	}
	ctl(true, "list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers")
	ctl(true, "list_consumers", "queue_name", "channel_pid", "ack_required", "prefetch_count", "active")
	ctl(false, "list_channels", "pid", "connection", "consumer_count", "messages_unacknowledged", "prefetch_count", "state")
	return b.String()
}

// LogLines returns the lines of the node's logs, of every start, that
// contain any of words: what the node said about its recoveries
// ("dropped", "Restarting crashed queue", "unclean shutdown").
func (r *RabbitMQ) LogLines(words ...string) []string {
	files, _ := filepath.Glob(filepath.Join(r.dir, "log", "*.log"))
	outs, _ := filepath.Glob(filepath.Join(r.dir, "rabbitmq-*.out"))
	var lines []string
	for _, f := range append(files, outs...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, w := range words {
				if strings.Contains(line, w) {
					lines = append(lines, line)
					break
				}
			}
		}
	}
	return lines
}
