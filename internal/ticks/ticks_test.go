package ticks

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// counter counts calls and signals every one.
type counter struct {
	n  atomic.Int64
	ch chan struct{}
}

func newCounter() *counter { return &counter{ch: make(chan struct{}, 1<<16)} }

func (c *counter) fn() bool {
	c.n.Add(1)
	c.ch <- struct{}{}
	return true
}

// waitCalls waits until c was called at least n times in all.
func (c *counter) waitCalls(t *testing.T, n int64) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for c.n.Load() < n {
		select {
		case <-c.ch:
		case <-deadline:
			t.Fatalf("%d calls, want %d", c.n.Load(), n)
		}
	}
}

func TestEveryTickIsCalledUntilStopped(t *testing.T) {
	s := New(2 * time.Millisecond)
	const n = 1000
	ticks := make([]Tick, n)
	counts := make([]*counter, n)
	for i := range ticks {
		counts[i] = newCounter()
		s.Start(&ticks[i], Func(counts[i].fn))
	}
	for i := range counts {
		counts[i].waitCalls(t, 3)
	}
	// Stop the odd ones; the even ones go on, so time passes for all.
	stoppedAt := make([]int64, n)
	for i := 1; i < n; i += 2 {
		s.Stop(&ticks[i])
		stoppedAt[i] = counts[i].n.Load()
	}
	for i := 0; i < n; i += 2 {
		counts[i].waitCalls(t, counts[i].n.Load()+3)
	}
	for i := 1; i < n; i += 2 {
		if extra := counts[i].n.Load() - stoppedAt[i]; extra > 1 {
			t.Fatalf("tick %d was called %d times after Stop (at most one call already starting may run)", i, extra)
		}
	}
	// A stopped tick can start again.
	before := counts[1].n.Load()
	s.Start(&ticks[1], Func(counts[1].fn))
	counts[1].waitCalls(t, before+2)
	for i := range ticks {
		s.Stop(&ticks[i])
	}
}

func TestFalseEndsTheTick(t *testing.T) {
	s := New(time.Millisecond)
	var calls atomic.Int64
	var once Tick
	s.Start(&once, Func(func() bool { calls.Add(1); return false }))
	other := newCounter()
	var tk Tick
	s.Start(&tk, Func(other.fn))
	// Once the other tick ran five times, the first had every chance.
	other.waitCalls(t, 5)
	s.Stop(&tk)
	if got := calls.Load(); got != 1 {
		t.Fatalf("a tick whose function returned false was called %d times, want 1", got)
	}
}

func TestASlowCallDelaysNoOther(t *testing.T) {
	s := New(time.Millisecond)
	release := make(chan struct{})
	var slowCalls atomic.Int64
	var slow, fast Tick
	s.Start(&slow, Func(func() bool { slowCalls.Add(1); <-release; return true }))
	c := newCounter()
	s.Start(&fast, Func(c.fn))
	c.waitCalls(t, 20)
	if got := slowCalls.Load(); got != 1 {
		t.Fatalf("the blocked tick was called %d times while blocked, want 1", got)
	}
	close(release)
	s.Stop(&slow)
	s.Stop(&fast)
}

func TestConcurrentStartStop(t *testing.T) {
	s := New(time.Millisecond)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				var tk Tick
				s.Start(&tk, Func(func() bool { return true }))
				s.Stop(&tk)
			}
		}()
	}
	wg.Wait()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if sh.head != nil || sh.tail != nil {
			t.Fatalf("ticks left queued on shard %d after every one was stopped", i)
		}
		sh.mu.Unlock()
	}
}

// BenchmarkStartStop starts and stops a tick per op from every P at once,
// as a Guard does around each run: the cost a run pays the scheduler when
// many runs start and end together.
func BenchmarkStartStop(b *testing.B) {
	s := New(time.Hour)
	h := Func(func() bool { return true })
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ts := make([]Tick, 64) // a few runs in flight per goroutine, as with a real store
		i := 0
		for pb.Next() {
			t := &ts[i%len(ts)]
			s.Start(t, h)
			s.Stop(t)
			i++
		}
	})
}
