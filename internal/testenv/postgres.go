package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is a PostgreSQL server of a test's own (StartPostgres), which
// the test may crash: the machine's shared server serves other tests at
// the same time.
type Postgres struct {
	// URL is postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
	// (trust authentication).
	URL string

	bin, dir string
	args     []string
	addr     string
	cred     *syscall.Credential // the postgres user's, when the test runs as root
	proc     *server
	starts   int
	held     heldPorts // while killed: its address, for Start
}

// postgresBin is the directory of PostgreSQL's programs:
// $IDEM_TEST_POSTGRES_BIN, else the newest /usr/lib/postgresql/*/bin
// (Debian's), else the directory of the PATH's initdb.
func postgresBin() (string, error) {
	if d := os.Getenv("IDEM_TEST_POSTGRES_BIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { // 9.6 < 15 < 16: by number
		va, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(a)), 64)
		vb, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(b)), 64)
		return int(va - vb)
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", err
	}
	return filepath.Dir(p), nil
}

// StartPostgres initialises a database cluster in a directory of its own
// and starts a PostgreSQL server on it, on a free loopback port, with the
// given settings (name=value, as postgres -c takes them) over the
// defaults and recovery_init_sync_method=syncfs; the server is stopped and
// its files removed when the test ends. PostgreSQL refuses to run as root:
// a test running as root runs it as the postgres user. It takes about a
// second.
func StartPostgres(t testing.TB, settings ...string) *Postgres {
	t.Helper()
	skipShort(t, "a PostgreSQL server")
	bin, err := postgresBin()
	if err != nil {
		Need(t, "PostgreSQL's programs (initdb, postgres)", "/usr/lib/postgresql/*/bin or PATH", err)
	}
	dir, err := os.MkdirTemp("", "idem-postgres-")
	if err != nil {
		t.Fatal(err)
	}
	p := &Postgres{bin: bin, dir: dir}
	t.Cleanup(func() {
		p.stop()
		p.held.release()
		os.RemoveAll(dir)
	})
	p.cred = serviceUser(t, "postgres", dir, "PostgreSQL refuses to run as root")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", p.data(), "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	// After a crash the server syncs its data directory before it recovers:
	// file by file (the default), that took 0.2–0.6 s of a crash's outage
	// in the campaigns under -race; one syncfs took under 0.1 s.
	p.args = []string{"-c", "recovery_init_sync_method=syncfs"}
	for _, s := range settings {
		p.args = append(p.args, "-c", s)
	}
	startOnFreePorts(t, "postgres", func(int) error {
		p.addr = "127.0.0.1:" + strconv.Itoa(freePort(t))
		p.URL = "postgres://postgres@" + p.addr + "/postgres?sslmode=disable"
		return p.start()
	})
	return p
}

// Addr is the server's host:port.
func (p *Postgres) Addr() string { return p.addr }

func (p *Postgres) data() string { return filepath.Join(p.dir, "data") }

// start starts the server (the postmaster puts itself and its children in
// a process group of their own) and waits until it takes queries.
func (p *Postgres) start() error {
	p.starts++
	log := filepath.Join(p.dir, fmt.Sprintf("postgres-%d.log", p.starts))
	out, err := os.Create(log)
	if err != nil {
		return err
	}
	defer out.Close()
	host, port, _ := net.SplitHostPort(p.addr)
	args := append([]string{"-D", p.data(), "-p", port, "-k", p.dir, "-c", "listen_addresses=" + host}, p.args...)
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: p.cred}
	proc, err := startServer(cmd, log, p.dir)
	if err != nil {
		return err
	}
	err = proc.waitReady(60*time.Second, func() error {
		if err := proc.logSays("ready to accept"); err != nil { // connections, or read-only ones (a standby)
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, p.URL)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		return c.Ping(ctx)
	})
	if err != nil {
		kill(proc)
		return err
	}
	p.proc = proc
	return nil
}

func (p *Postgres) stop() {
	if p.proc != nil {
		kill(p.proc)
		p.proc = nil
	}
}

// kill kills the postmaster and every process it started, with SIGKILL,
// and waits until they are gone. Each backend and auxiliary process puts
// itself in a session of its own (setsid), so a kill of the postmaster's
// group would leave them running until they notice its death — and a
// restart would find them holding the old server's shared memory. The
// postmaster is stopped first, so it starts no process between the
// listing and the kill.
func kill(pm *server) {
	pid := pm.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	children := liveProcesses(func(_, ppid, _ int) bool { return ppid == pid })
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, c := range children {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	<-pm.exited
	waitGone(func(pid, _, _ int) bool { return slices.Contains(children, pid) })
}

// Crash kills the server — the postmaster and every backend — with
// SIGKILL and starts it again on its port and data: it recovers from its
// write-ahead log, as after a power cut that spared the disk. It fails t
// if the server does not come back; call it from the test's goroutine, or
// Restart.
func (p *Postgres) Crash(t testing.TB) {
	t.Helper()
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
}

// Restart is Crash for any goroutine: it returns why the server did not
// come back.
func (p *Postgres) Restart() error {
	p.Kill()
	return p.Start()
}

// Kill kills the server as Crash does, and leaves it down until Start; no
// other socket takes its address meanwhile.
func (p *Postgres) Kill() {
	p.stop()
	p.held = holdPorts(p.addr)
}

// Start starts a killed server again on its port and data, waiting until
// it takes queries.
func (p *Postgres) Start() error {
	err := p.start()
	p.held.release()
	p.held = nil
	if err != nil {
		return fmt.Errorf("postgres on %s, after the kill: %w", p.addr, err)
	}
	return nil
}

// connect opens a connection to the server, closed when t ends.
func (p *Postgres) connect(t testing.TB) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), p.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// Reconfigure changes a setting of the running server as an operator does
// (ALTER SYSTEM, then a reload) and waits until a new session sees it:
// sessions already open take it at their next statement. A setting given to
// StartPostgres outranks it.
func (p *Postgres) Reconfigure(t testing.TB, name, value string) {
	t.Helper()
	ctx := context.Background()
	c := p.connect(t)
	if _, err := c.Exec(ctx, `ALTER SYSTEM SET `+pgx.Identifier{name}.Sanitize()+` = `+pgx.Identifier{value}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "new sessions see "+name+" = "+value, func() error {
		s, err := pgx.Connect(ctx, p.URL)
		if err != nil {
			return err
		}
		defer s.Close(ctx)
		var v string
		if err := s.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil || v != value {
			return fmt.Errorf("%s is %q (%v)", name, v, err)
		}
		return nil
	})
}

// serviceUser is the credential of the system user name, who then owns
// dir, when the test runs as root (nil otherwise): a server that will not
// run as root (why) runs as that user.
func serviceUser(t testing.TB, name, dir, why string) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		Need(t, "the "+name+" user ("+why+")", "/etc/passwd", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}
