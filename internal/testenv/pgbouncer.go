package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	return startPgBouncerFor(t, "127.0.0.1", 5432, "test")
}

// PgBouncerPool connects a pgx pool to the PgBouncer at url as transaction
// pooling needs it (exec mode: no prepared statements), closed when the
// test ends.
func PgBouncerPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PgBouncer starts a PgBouncer process in transaction pooling mode in
// front of the server, as StartPgBouncer does in front of the shared one,
// and returns its connection string (database postgres). It tries the
// server again a second after a failed login (server_login_retry), so it
// serves again soon after the server is back from a crash.
func (p *Postgres) PgBouncer(t testing.TB) string {
	t.Helper()
	host, port, err := net.SplitHostPort(p.addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	return startPgBouncerFor(t, host, n, "postgres")
}

// startPgBouncerFor starts PgBouncer in front of database db at host:port.
func startPgBouncerFor(t testing.TB, host string, port int, db string) string {
	t.Helper()
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
		addr, err = startPgBouncer(t, bin, dir, freePort(t), target{host, port, db})
		return err
	})
	return "postgres://postgres@" + addr + "/" + db + "?sslmode=disable"
}

// target is the database a PgBouncer serves: its server and name.
type target struct {
	host string
	port int
	db   string
}

// startPgBouncer writes the configuration for port into dir and starts
// PgBouncer in front of to, stopped when the test ends; it returns the
// address once PgBouncer listens.
func startPgBouncer(t testing.TB, bin, dir string, port int, to target) (string, error) {
	ini := fmt.Sprintf(`[databases]
%[5]s = host=%[6]s port=%[7]d dbname=%[5]s user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[1]d
unix_socket_dir =
auth_type = trust
auth_file = %[2]s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
logfile = %[3]s
pidfile = %[4]s
server_login_retry = 1
`, port, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"),
		to.db, to.host, to.port)
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
	proc, err := startServer(cmd, filepath.Join(dir, "pgbouncer.log"), dir)
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
