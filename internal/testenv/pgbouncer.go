package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// StartPgBouncer starts a PgBouncer process in transaction pooling mode in
// front of the test PostgreSQL (127.0.0.1:5432, database test, user
// postgres, trust), on a free loopback port, stopped when the test ends. It
// returns the connection string of the bouncer (pgx: add
// default_query_exec_mode=exec, or use pgstore's PgBouncer option, since
// prepared statements do not survive transaction pooling in PgBouncer 1.18).
func StartPgBouncer(t testing.TB) string {
	t.Helper()
	ProbePostgres(t)
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		Need(t, "pgbouncer (the Debian package, installed by .ci/run)", "PATH", err)
	}
	dir, err := os.MkdirTemp("", "idem-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var addr string
	startOnFreePorts(t, "pgbouncer", func(int) (err error) {
		addr, err = startPgBouncer(t, bin, dir, freePort(t))
		return err
	})
	return "postgres://postgres@" + addr + "/test?sslmode=disable"
}

// startPgBouncer writes the configuration for port into dir and starts
// PgBouncer, stopped when the test ends; it returns the address once
// PgBouncer listens.
func startPgBouncer(t testing.TB, bin, dir string, port int) (string, error) {
	ini := fmt.Sprintf(`[databases]
test = host=127.0.0.1 port=5432 dbname=test user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
logfile = %s
pidfile = %s
`, port, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return "", err
		}
	}
	// PgBouncer refuses to run as root: it drops to the postgres user,
	// which must read the directory.
	if err := os.Chmod(dir, 0o777); err != nil {
		return "", err
	}
	args := []string{"-q", filepath.Join(dir, "pgbouncer.ini")} // -q: the log goes to its file only
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres"}, args...)
	}
	_ = os.Remove(filepath.Join(dir, "pgbouncer.pid")) // an earlier attempt's
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	proc, err := startServer(cmd, filepath.Join(dir, "pgbouncer.log"))
	if err != nil {
		return "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := proc.waitReady(10*time.Second, func() error {
		if err := proc.logSays(" LOG process up: "); err != nil { // after it bound the port
			return err
		}
		return listening(addr)
	}); err != nil {
		proc.stop()
		return "", err
	}
	t.Cleanup(func() { proc.stopReporting(t, "pgbouncer") })
	return addr, nil
}
