package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// MariaDB is a MariaDB server of a test's own (StartMariaDB), which the
// test may crash: the machine's shared server serves other tests at the
// same time.
type MariaDB struct {
	// URL is mysql://root@127.0.0.1:PORT/idem, a database the server was
	// started with (no grant tables: any user name, no password).
	URL string

	dir, addr string
	cred      *syscall.Credential // the mysql user's, when the test runs as root
	proc      *server
	starts    int
	held      heldPorts
}

// StartMariaDB initialises a data directory of its own and starts mariadbd
// on it, on a free loopback port, with InnoDB's durable defaults
// (innodb_flush_log_at_trx_commit=1); the server is stopped and its files
// removed when the test ends. A test running as root runs it as the mysql
// user.
func StartMariaDB(t testing.TB) *MariaDB {
	t.Helper()
	skipShort(t, "a MariaDB server")
	install, err := exec.LookPath("mariadb-install-db")
	if err != nil {
		Need(t, "mariadb-install-db (Debian's mariadb-server)", "PATH", err)
	}
	dir, err := os.MkdirTemp("", "idem-mariadb-")
	if err != nil {
		t.Fatal(err)
	}
	m := &MariaDB{dir: dir}
	t.Cleanup(func() {
		m.stop()
		m.held.release()
		os.RemoveAll(dir)
	})
	m.cred = serviceUser(t, "mysql", dir, "mariadbd as root needs one to run as")
	cmd := exec.Command(install, "--no-defaults", "--datadir="+m.data(), "--auth-root-authentication-method=normal",
		"--skip-test-db", "--skip-name-resolve")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	startOnFreePorts(t, "mariadbd", func(int) error {
		m.addr = "127.0.0.1:" + strconv.Itoa(freePort(t))
		m.URL = "mysql://root@" + m.addr + "/idem"
		return m.start()
	})
	return m
}

func (m *MariaDB) data() string { return filepath.Join(m.dir, "data") }

// Addr is the server's host:port.
func (m *MariaDB) Addr() string { return m.addr }

func (m *MariaDB) start() error {
	m.starts++
	log := filepath.Join(m.dir, fmt.Sprintf("mariadb-%d.log", m.starts))
	out, err := os.Create(log)
	if err != nil {
		return err
	}
	defer out.Close()
	_, port, _ := net.SplitHostPort(m.addr)
	cmd := exec.Command("/usr/sbin/mariadbd", "--no-defaults", "--datadir="+m.data(), "--port="+port, "--bind-address=127.0.0.1",
		"--socket="+filepath.Join(m.dir, "sock"), "--pid-file="+filepath.Join(m.dir, "pid"), "--skip-grant-tables",
		"--innodb-flush-log-at-trx-commit=1", "--innodb-buffer-pool-size=64M", "--skip-log-bin", "--log-error="+log)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: m.cred}
	proc, err := startServer(cmd, log, m.dir)
	if err != nil {
		return err
	}
	err = proc.waitReady(60*time.Second, func() error {
		if err := proc.logSays("ready for connections"); err != nil {
			return err
		}
		db, err := sql.Open("mysql", "root@tcp("+m.addr+")/")
		if err != nil {
			return err
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS idem")
		return err
	})
	if err != nil {
		killGroup(proc)
		return err
	}
	m.proc = proc
	return nil
}

func (m *MariaDB) stop() {
	if m.proc != nil {
		killGroup(m.proc)
		m.proc = nil
	}
}

// Crash kills the server with SIGKILL and starts it again on its port and
// data: InnoDB recovers from its redo log, as after a power cut that
// spared the disk. It fails t if the server does not come back; call it
// from the test's goroutine, or Restart.
func (m *MariaDB) Crash(t testing.TB) {
	t.Helper()
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
}

// Restart is Crash for any goroutine: it returns why the server did not
// come back.
func (m *MariaDB) Restart() error {
	m.stop()
	m.held = holdPorts(m.addr)
	err := m.start()
	m.held.release()
	if err != nil {
		return fmt.Errorf("mariadbd on %s, after the kill: %w", m.addr, err)
	}
	return nil
}
