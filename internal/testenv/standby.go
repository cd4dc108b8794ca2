package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby starts a streaming replica of the running server p, as a
// failover target is run: a base backup of p's data (pg_basebackup),
// started as a hot standby on a free port of its own, streaming from p as
// application name — the name p's synchronous_standby_names may give it —
// through the returned proxy, which a test cuts to part the two (a stopped
// standby would not do: the kernel still takes what p sends it). It returns
// once p sees it streaming. The standby is stopped and its files removed
// when the test ends.
func (p *Postgres) StartStandby(t testing.TB, name string) (*Postgres, *Proxy) {
	t.Helper()
	dir, err := os.MkdirTemp("", "idem-standby-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Postgres{bin: p.bin, dir: dir, cred: p.cred}
	t.Cleanup(func() {
		s.stop()
		s.held.release()
		os.RemoveAll(dir)
	})
	if p.cred != nil {
		if err := os.Chown(dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	link := StartProxy(t, p.addr)
	host, port, _ := net.SplitHostPort(link.Addr())
	conninfo := fmt.Sprintf("host=%s port=%s user=postgres application_name=%s", host, port, name)
	backup := exec.Command(filepath.Join(p.bin, "pg_basebackup"), "-D", s.data(), "-d", conninfo,
		"-X", "stream", "-R", "--no-sync", "-c", "fast")
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if out, err := backup.CombinedOutput(); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	// None of p's settings: promoted, it has no standby of its own to wait for.
	s.args = []string{"-c", "primary_conninfo=" + conninfo, "-c", "hot_standby=on"}
	startOnFreePorts(t, "postgres standby", func(int) error {
		s.addr = "127.0.0.1:" + strconv.Itoa(freePort(t))
		s.URL = "postgres://postgres@" + s.addr + "/postgres?sslmode=disable"
		return s.start()
	})
	Eventually(t, 30*time.Second, name+" streams from the primary", func() error {
		ctx := context.Background()
		c, err := pgx.Connect(ctx, p.URL)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		var state string
		err = c.QueryRow(ctx, `SELECT state FROM pg_stat_replication WHERE application_name = $1`, name).Scan(&state)
		if err == nil && state != "streaming" {
			err = fmt.Errorf("its state is %s", state)
		}
		return err
	})
	return s, link
}

// Promote makes a standby the primary (pg_promote) and waits until it is.
func (p *Postgres) Promote(t testing.TB) {
	t.Helper()
	var done bool
	if err := p.connect(t).QueryRow(context.Background(), `SELECT pg_promote(true, 60)`).Scan(&done); err != nil || !done {
		t.Fatalf("promote the standby on %s: %v, %v", p.addr, done, err)
	}
}

// FailOver fails primary over to standby (StartStandby's, streaming through
// link) under writes, as a failover manager does when the primary dies,
// and returns the ids whose write was acknowledged and how many of them
// were written while the two were parted. write(ctx, id) writes id and
// reports whether the write was acknowledged. First 100 writes one by one
// with the standby streaming (each must be acknowledged); then the
// standby is parted from the primary (link cut: a standby stopped with
// SIGSTOP would not do, the kernel would still take what the primary
// sends it) while eight goroutines write new ids for 300 ms — a write that
// waits for the standby is never acknowledged, one that does not is
// acknowledged and then lost — then the primary is killed (SIGKILL) and
// the standby promoted.
func FailOver(t testing.TB, primary, standby *Postgres, link *Proxy, write func(ctx context.Context, id string) bool) (acked []string, whileParted int) {
	t.Helper()
	var mu sync.Mutex
	note := func(ctx context.Context, id string) {
		if write(ctx, id) {
			mu.Lock()
			acked = append(acked, id)
			mu.Unlock()
		}
	}
	ctx := context.Background()
	for i := range 100 {
		note(ctx, fmt.Sprintf("before%03d", i))
	}
	if len(acked) != 100 {
		t.Fatalf("%d of 100 writes acknowledged with the standby streaming", len(acked))
	}
	link.Cut()
	writing, stop := context.WithCancel(ctx)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for writing.Err() == nil {
				note(writing, fmt.Sprintf("parted%05d", next.Add(1)))
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // the window of writes while they are parted
	stop()
	wg.Wait()
	primary.Kill()
	standby.Promote(t)
	return acked, len(acked) - 100
}
