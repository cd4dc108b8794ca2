package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// server is a server process a test started, watched for its exit.
type server struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	err    error         // cmd.Wait's, once exited is closed
	log    string        // its log file, quoted when it exits early
}

// startServer starts cmd; log names its log file ("" for none), dir the
// directory of the server's own files ("" for none). If this process dies
// while the server runs — a test binary killed at its timeout, or with
// SIGKILL, runs no cleanup — a watchdog kills the server (its process
// group, if it leads one) and removes dir.
func startServer(cmd *exec.Cmd, log, dir string) (*server, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	target := strconv.Itoa(cmd.Process.Pid)
	if cmd.SysProcAttr != nil && cmd.SysProcAttr.Setpgid {
		target = "-" + target
	}
	dog, err := startWatchdog(target, dir)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	s := &server{cmd: cmd, exited: make(chan struct{}), log: log}
	go func() { s.err = cmd.Wait(); dog.dismiss(); close(s.exited) }()
	return s, nil
}

// watchdog is a shell that waits on a pipe whose writing end only this
// process holds (Go opens pipes close-on-exec, so no server inherits it):
// told "done", it exits; at the end of the pipe — this process is gone,
// and the kernel closed its end — it kills what it watches and removes its
// directory. It runs in a process group of its own, so a signal to this
// process's group (an interrupt at the terminal) does not take it too.
type watchdog struct {
	w   *os.File
	cmd *exec.Cmd
}

// watchdogScript: $1 the process (or, negative, the process group) to
// kill, $2 the directory to remove ("" for none). Processes a killed
// PostgreSQL leaves (each in a session of its own) exit by themselves once
// they see the postmaster gone; the pause lets them before the removal.
const watchdogScript = `if read -r line && [ "$line" = done ]; then exit 0; fi
kill -s KILL -- "$1" 2>/dev/null
if [ -n "$2" ]; then sleep 1; rm -rf -- "$2"; fi`

func startWatchdog(target, dir string) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "idem-testenv-watchdog", target, dir)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	return &watchdog{w: w, cmd: cmd}, nil
}

// dismiss tells the watchdog that the server has exited (and been reaped:
// its process id may be another process's from now on) and waits for it.
func (d *watchdog) dismiss() {
	_, _ = d.w.WriteString("done\n")
	_ = d.w.Close()
	_ = d.cmd.Wait()
}

// earlyExitError: a server exited before it answered — most often because
// a port that was free when chosen was taken before the server bound it
// (another test's server, a client's ephemeral port). Start it again on
// new ports.
type earlyExitError struct {
	err error
	log string // the last lines of its log
}

func (e *earlyExitError) Error() string {
	return fmt.Sprintf("exited before it answered (%v); its log ends:\n%s", e.err, e.log)
}

// startOnFreePorts runs start, which starts a server on ports it picks,
// until it succeeds. A port free when chosen may be taken before the server
// binds it: a server that exited before it answered (an *earlyExitError) is
// started again — new ports, attempt numbered from 1 — up to five times;
// any other error fails t.
func startOnFreePorts(t testing.TB, name string, start func(attempt int) error) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := start(attempt)
		if err == nil {
			return
		}
		var exit *earlyExitError
		if !errors.As(err, &exit) || attempt == 5 {
			t.Fatalf("%s (attempt %d): %v", name, attempt, err)
		}
		t.Logf("%s %v; again on new ports", name, err)
	}
}

// waitReady polls ready every 20 ms until it returns nil, the process
// exits (an *earlyExitError) or timeout passes (the process is then
// killed).
func (s *server) waitReady(timeout time.Duration, ready func() error) error {
	deadline := time.After(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready()
		if err == nil {
			select {
			case <-s.exited: // what answered was another process
			default:
				return nil
			}
		}
		select {
		case <-s.exited:
			return &earlyExitError{err: s.err, log: s.logTail()}
		case <-deadline:
			s.stop()
			return fmt.Errorf("not ready within %v (%v); its log ends:\n%s", timeout, err, s.logTail())
		case <-tick.C:
		}
	}
}

// freePort returns a loopback port that was free when chosen.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// listening reports whether something accepts connections at addr.
func listening(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err == nil {
		c.Close()
	}
	return err
}

// logSays reports whether the server's own log has a line containing
// what: a server that says it listens is the one listening, not another
// process holding the port.
func (s *server) logSays(what string) error {
	b, err := os.ReadFile(s.log)
	if err == nil && !strings.Contains(string(b), what) {
		err = fmt.Errorf("its log does not say %q yet", what)
	}
	return err
}

// stopReporting is stop for t's cleanup: a server that exited during the
// test (crashed, or was killed by something else) fails t with the end of
// its log — what its clients saw is not the code under test's doing — and
// a test that failed gets the end of the log of the server it ran against.
func (s *server) stopReporting(t testing.TB, name string) {
	select {
	case <-s.exited:
		t.Errorf("%s exited during the test (%v); its log ends:\n%s", name, s.err, s.logTail())
	default:
		if t.Failed() {
			t.Logf("%s's log ends:\n%s", name, s.logTail())
		}
	}
	s.stop()
}

// stop kills the process and waits for it (nothing if it has exited).
func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// logTail returns the last lines of the server's log.
func (s *server) logTail() string {
	if s.log == "" {
		return ""
	}
	b, _ := os.ReadFile(s.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-12):], "\n")
}
