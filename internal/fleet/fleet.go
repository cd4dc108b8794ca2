// Package fleet runs a fault campaign's helper processes — copies of the
// test binary — and kills and freezes them at random.
package fleet

import (
	"bufio"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Fleet is a fault campaign's helper processes: copies of this test binary,
// numbered from 1, that a campaign kills (SIGKILL, replaced by a new one)
// and freezes (SIGSTOP, then SIGCONT) at random. It remembers when each was
// killed and frozen, for the checks.
type Fleet struct {
	t testing.TB
	// command returns the command of process n (not started).
	command func(n int) *exec.Cmd
	ready   string

	mu        sync.Mutex
	last      int
	children  []*exec.Cmd
	number    map[*exec.Cmd]int
	output    map[*exec.Cmd]chan struct{} // closed when its standard output ended
	frozenNow map[*exec.Cmd]int64         // unix ns
	frozen    map[int][][2]int64          // process → intervals, unix ns
	killed    map[int]int64               // process → unix ns
}

// New returns an empty fleet. Process n runs testName with env(n)
// added to this process's environment, and is ready once it prints ready
// (what it prints before goes to standard error; after, it is read and
// dropped); every process is killed when the test ends.
func New(t testing.TB, testName, ready string, args []string, env func(n int) []string) *Fleet {
	f := &Fleet{t: t, ready: ready, number: map[*exec.Cmd]int{}, output: map[*exec.Cmd]chan struct{}{}, frozenNow: map[*exec.Cmd]int64{},
		frozen: map[int][][2]int64{}, killed: map[int]int64{}}
	f.command = func(n int) *exec.Cmd {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^" + testName + "$", "-test.count=1"}, args...)...)
		cmd.Env = append(os.Environ(), env(n)...)
		return cmd
	}
	t.Cleanup(f.StopAll)
	return f
}

// Spawn starts the next process and waits until it is ready.
func (f *Fleet) Spawn() {
	f.mu.Lock()
	f.last++
	n := f.last
	f.mu.Unlock()
	cmd := f.command(n)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		f.t.Errorf("start helper process %d: %v", n, err)
		return
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != f.ready {
		fmt.Fprintf(os.Stderr, "helper process %d: %s\n", n, sc.Text())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sc.Scan() {
			if sc.Text() != "PASS" {
				fmt.Fprintf(os.Stderr, "helper process %d: %s\n", n, sc.Text())
			}
		}
	}()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.children = append(f.children, cmd)
	f.number[cmd] = n
	f.output[cmd] = done
}

// Len is how many processes run.
func (f *Fleet) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.children)
}

// reap waits for c's output to end, then for c.
func (f *Fleet) reap(c *exec.Cmd) error {
	f.mu.Lock()
	done := f.output[c]
	f.mu.Unlock()
	<-done
	return c.Wait()
}

// KillOne kills a process with SIGKILL, waits for it and starts another.
func (f *Fleet) KillOne(rng *rand.Rand) {
	f.mu.Lock()
	if len(f.children) == 0 {
		f.mu.Unlock()
		return
	}
	i := rng.IntN(len(f.children))
	c := f.children[i]
	f.children = slices.Delete(f.children, i, i+1)
	f.thawLocked(c)
	f.mu.Unlock()
	_ = c.Process.Signal(syscall.SIGKILL)
	_ = f.reap(c)
	f.mu.Lock()
	f.killed[f.number[c]] = time.Now().UnixNano()
	f.mu.Unlock()
	f.Spawn()
}

// FreezeOne stops a process with SIGSTOP and lets it go on after d (in the
// background). A process frozen already stays as it is.
func (f *Fleet) FreezeOne(rng *rand.Rand, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.children) == 0 {
		return
	}
	c := f.children[rng.IntN(len(f.children))]
	if _, ok := f.frozenNow[c]; ok || c.Process.Signal(syscall.SIGSTOP) != nil {
		return
	}
	f.frozenNow[c] = time.Now().UnixNano()
	time.AfterFunc(d, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.thawLocked(c)
	})
}

func (f *Fleet) thawLocked(c *exec.Cmd) {
	at, ok := f.frozenNow[c]
	if !ok {
		return
	}
	_ = c.Process.Signal(syscall.SIGCONT)
	delete(f.frozenNow, c)
	n := f.number[c]
	f.frozen[n] = append(f.frozen[n], [2]int64{at, time.Now().UnixNano()})
}

// ThawAll lets every frozen process go on.
func (f *Fleet) ThawAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.frozenNow {
		f.thawLocked(c)
	}
}

// StopAll kills every process and waits for them.
func (f *Fleet) StopAll() { f.endAll(syscall.SIGKILL) }

// DumpAll ends every process with SIGQUIT, on which the Go runtime writes
// the stacks of all its goroutines to the process's stderr (the test's)
// before it exits, and waits for them: what a failed campaign shows of
// where its processes were.
func (f *Fleet) DumpAll() { f.endAll(syscall.SIGQUIT) }

func (f *Fleet) endAll(sig syscall.Signal) {
	f.mu.Lock()
	cs := f.children
	f.children = nil
	for _, c := range cs {
		f.thawLocked(c)
	}
	f.mu.Unlock()
	for _, c := range cs {
		_ = c.Process.Signal(sig)
		_ = f.reap(c)
	}
}

// Wait waits for every process to end on its own and reports those that
// failed.
func (f *Fleet) Wait() {
	f.mu.Lock()
	cs := f.children
	f.children = nil
	number := maps.Clone(f.number)
	f.mu.Unlock()
	for _, c := range cs {
		if err := f.reap(c); err != nil {
			f.t.Errorf("helper process %d: %v", number[c], err)
		}
	}
}

// FrozenDuring reports whether process n was frozen at some moment of
// [from, to] (unix ns).
func (f *Fleet) FrozenDuring(n int, from, to int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, iv := range f.frozen[n] {
		if iv[0] <= to && iv[1] >= from {
			return true
		}
	}
	return false
}

// LostDuring reports whether process n was killed or frozen at some moment
// of [from, to] (unix ns): work it ran then cannot have stopped in time.
func (f *Fleet) LostDuring(n int, from, to int64) bool {
	if at, ok := f.KilledAt(n); ok && at >= from && at <= to {
		return true
	}
	return f.FrozenDuring(n, from, to)
}

// AnyFrozenDuring reports whether some process was frozen at some moment of
// [from, to] (unix ns): one that shares a file with the others (SQLite)
// may have held its lock meanwhile, an outage for every process.
func (f *Fleet) AnyFrozenDuring(from, to int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ivs := range f.frozen {
		for _, iv := range ivs {
			if iv[0] <= to && iv[1] >= from {
				return true
			}
		}
	}
	for _, at := range f.frozenNow {
		if at <= to {
			return true
		}
	}
	return false
}

// KilledMillis returns when each process killed was (unix ms).
func (f *Fleet) KilledMillis() map[int]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[int]int64, len(f.killed))
	for n, ns := range f.killed {
		out[n] = ns / int64(time.Millisecond)
	}
	return out
}

// KilledAt returns when process n was killed (unix ns), if it was.
func (f *Fleet) KilledAt(n int) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.killed[n]
	return at, ok
}
