package storetest

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// Environment of a child process started by MultiProcess or CrashTakeover.
const (
	envMode     = "IDEM_STORETEST_MODE"
	envLocation = "IDEM_STORETEST_LOCATION"
	envLog      = "IDEM_STORETEST_LOG"
)

// OpenAt opens the store at a location shared between processes (a file
// path, a schema name, a key prefix).
type OpenAt func(t testing.TB, location string) store.Store

// IsChild reports whether this test binary was started by MultiProcess or
// CrashTakeover. A child must not drop the shared store at its cleanup.
func IsChild() bool { return os.Getenv(envMode) != "" }

func childCommand(t *testing.T, testName, mode, location, log string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^"+testName+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envMode+"="+mode, envLocation+"="+location, envLog+"="+log)
	cmd.Stderr = os.Stderr
	return cmd
}

// MultiProcess starts `procs` copies of the test binary that hammer the same
// `keys` keys of the store at location, each through an idem.Guard, in its own
// random order, and checks that every key's work ran exactly once across all
// processes. Call it from a test named testName; in the children it runs the
// worker instead.
func MultiProcess(t *testing.T, testName, location string, procs, keys int, open OpenAt) {
	if os.Getenv(envMode) == "hammer" {
		hammer(t, open(t, os.Getenv(envLocation)), keys, os.Getenv(envLog))
		return
	}
	log := t.TempDir() + "/executions.log"
	open(t, location) // creates the schema before the children race for it
	cmds := make([]*exec.Cmd, procs)
	for i := range cmds {
		cmds[i] = childCommand(t, testName, "hammer", location, log)
		cmds[i].Stdout = nil
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line != "" {
			counts[line]++
		}
	}
	for i := range keys {
		k := "mp-" + strconv.Itoa(i)
		if counts[k] != 1 {
			t.Errorf("key %s executed %d times across %d processes, want 1", k, counts[k], procs)
		}
	}
	if len(counts) != keys {
		t.Errorf("%d distinct keys executed, want %d", len(counts), keys)
	}
	t.Logf("%d processes × %d keys: every key executed exactly once", procs, keys)
}

func hammer(t *testing.T, s store.Store, keys int, logPath string) {
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	order := rand.Perm(keys)
	ctx := context.Background()
	for _, i := range order {
		k := "mp-" + strconv.Itoa(i)
		for {
			_, err := idem.Do(ctx, g, idem.Key{ID: k}, func(ctx context.Context) (string, error) {
				// O_APPEND writes of one short line are atomic between processes.
				if _, err := f.WriteString(k + "\n"); err != nil {
					return "", err
				}
				return "done", nil
			})
			if err == idem.ErrInProgress {
				time.Sleep(time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatalf("key %s: %v", k, err)
			}
			break
		}
	}
}

// CrashTakeover starts a child process that acquires a key with a short lease
// and is then killed with SIGKILL while it holds the lease. It checks that the
// key is in progress until the dead owner's lease expires, then taken over
// with a larger fence, and that the new owner's result is what duplicates
// replay. Call it from a test named testName.
func CrashTakeover(t *testing.T, testName, location string, open OpenAt) {
	const lease = 2 * time.Second
	if os.Getenv(envMode) == "crash" {
		s := open(t, os.Getenv(envLocation))
		a, err := s.Acquire(context.Background(), store.AcquireRequest{Key: "crash", Fingerprint: "fp", Lease: lease, Retention: time.Hour})
		if err != nil || a.Outcome != store.Acquired {
			fmt.Printf("ERROR %v %v\n", a.Outcome, err)
			os.Exit(1)
		}
		fmt.Printf("ACQUIRED %d\n", a.Fence)
		time.Sleep(time.Minute) // killed here, mid-work
		os.Exit(3)
	}
	s := open(t, location)
	cmd := childCommand(t, testName, "crash", location, "")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var fence uint64
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f, ok := strings.CutPrefix(sc.Text(), "ACQUIRED "); ok {
			fence, _ = strconv.ParseUint(f, 10, 64)
			break
		}
		if strings.HasPrefix(sc.Text(), "ERROR") {
			t.Fatalf("child: %s", sc.Text())
		}
	}
	if fence == 0 {
		_ = cmd.Process.Kill()
		t.Fatal("child never acquired")
	}
	killedAt := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	ctx := context.Background()
	r := store.AcquireRequest{Key: "crash", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	sawInProgress := false
	deadline := time.Now().Add(lease + 10*time.Second)
	for {
		a, err := s.Acquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if a.Outcome == store.InProgress {
			sawInProgress = true
			if time.Now().After(deadline) {
				t.Fatal("the dead owner's lease never expired")
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if a.Outcome != store.TakenOver {
			t.Fatalf("after the owner was killed: %v", a.Outcome)
		}
		if a.Fence <= fence {
			t.Fatalf("takeover fence %d not larger than the dead owner's %d", a.Fence, fence)
		}
		if err := s.Complete(ctx, "crash", a.Fence, []byte("survivor"), time.Hour); err != nil {
			t.Fatal(err)
		}
		break
	}
	if !sawInProgress && time.Since(killedAt) < lease {
		t.Fatal("the key was free before the dead owner's lease expired")
	}
	if err := s.Complete(ctx, "crash", fence, []byte("zombie"), time.Hour); err == nil {
		t.Fatal("the dead owner's fence completed the record")
	}
	rep, err := s.Acquire(ctx, r)
	if err != nil || rep.Outcome != store.Replayed || string(rep.Record.Result) != "survivor" {
		t.Fatalf("replay after takeover: %v %q %v", rep.Outcome, rep.Record.Result, err)
	}
	t.Logf("owner (fence %d) killed with SIGKILL; in progress until its lease expired, then taken over", fence)
}
