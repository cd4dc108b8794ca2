// Package ticks drives many periodic callbacks of one interval with a few
// timers: the heartbeats of every run in flight on a Guard, or the
// in-progress signals of every message a broker handler holds. Starting and
// stopping a callback is a list insertion and removal under a mutex — no
// timer, no goroutine and no channel per callback; a goroutine is started
// only when a callback is due. The lists are sharded (a few per core, each
// with its mutex and timer), so callers on many cores starting and stopping
// callbacks at once rarely wait for one another.
package ticks

import (
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/idemgo/idem/internal/mono"
)

// Scheduler calls each started Tick's handler every interval, measured
// from the end of its previous call, until the Tick is stopped or its
// handler returns false. Calls of different Ticks run concurrently, so a
// slow one delays no other. The zero value is not usable; call New.
type Scheduler struct {
	interval time.Duration
	shards   []shard
	mask     uintptr
}

// shard is one list of queued ticks with its timer. A tick stays on the
// shard of its address.
type shard struct {
	interval   time.Duration
	mu         sync.Mutex
	head, tail *Tick // queued ticks, by due time (all share the interval)
	timer      *time.Timer
	pending    bool     // the timer is set, to fire no later than the head is due
	_          [64]byte // keeps each shard's mutex on a cache line of its own
}

// Handler is called on every tick; it returns whether to go on.
type Handler interface{ Tick() bool }

// Func is a function as a Handler.
type Func func() bool

// Tick calls f.
func (f Func) Tick() bool { return f() }

// Tick is one periodic callback. Embed it in a longer-lived value to save an
// allocation; a Tick may be started again after it was stopped.
type Tick struct {
	h          Handler
	prev, next *Tick
	due        mono.Time
	queued     bool
	stopped    bool
}

// New returns a scheduler of interval (> 0).
func New(interval time.Duration) *Scheduler {
	if interval <= 0 {
		panic("ticks: the interval must be positive")
	}
	n := 1 // a power of two, at least twice the cores (at most 64)
	for n < 2*runtime.GOMAXPROCS(0) && n < 64 {
		n *= 2
	}
	s := &Scheduler{interval: interval, shards: make([]shard, n), mask: uintptr(n - 1)}
	for i := range s.shards {
		s.shards[i].interval = interval
	}
	return s
}

// shardOf returns t's shard: chosen by its address (ticks live in
// different objects, allocated apart), so choosing costs no shared write.
func (s *Scheduler) shardOf(t *Tick) *shard {
	return &s.shards[(uintptr(unsafe.Pointer(t))>>6)&s.mask]
}

// Interval returns the scheduler's interval.
func (s *Scheduler) Interval() time.Duration { return s.interval }

// Start schedules h on t, first one interval from now.
func (s *Scheduler) Start(t *Tick, h Handler) { s.StartAt(t, h, mono.Now()) }

// StartAt is Start for a caller that has just read the clock: h is first
// called one interval after now.
func (s *Scheduler) StartAt(t *Tick, h Handler, now mono.Time) {
	sh := s.shardOf(t)
	sh.mu.Lock()
	t.h = h
	t.stopped = false
	sh.push(t, now)
	sh.mu.Unlock()
}

// Stop ends t: after Stop returns, the handler is not called again, except by a call
// that was already being started (at most one, at the moment Stop is
// called); a call already running finishes on its own.
func (s *Scheduler) Stop(t *Tick) {
	sh := s.shardOf(t)
	sh.mu.Lock()
	t.stopped = true
	if t.queued {
		sh.unlink(t)
	}
	sh.mu.Unlock()
}

// push queues t at the tail, due one interval after now. Every queued tick
// was queued no later than now with the same interval, so the queue stays
// sorted. Called with s.mu held.
func (s *shard) push(t *Tick, now mono.Time) {
	t.due = now.Add(s.interval)
	t.queued = true
	t.next = nil
	t.prev = s.tail
	if s.tail != nil {
		s.tail.next = t
	} else {
		s.head = t
		if !s.pending {
			// A timer still set for an earlier tick fires before t is due,
			// finds nothing due and sets itself for t: no reset needed.
			s.arm(s.interval)
		}
	}
	s.tail = t
}

func (s *shard) unlink(t *Tick) {
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		s.head = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		s.tail = t.prev
	}
	t.prev, t.next, t.queued = nil, nil, false
}

// arm sets the timer to fire after d. A fire that finds nothing due only
// re-arms, so a timer left set for a stopped tick is harmless.
func (s *shard) arm(d time.Duration) {
	s.pending = true
	if s.timer == nil {
		s.timer = time.AfterFunc(d, s.fire)
		return
	}
	s.timer.Reset(d)
}

// fire takes every due tick off the queue and calls each in its own
// goroutine.
func (s *shard) fire() {
	s.mu.Lock()
	s.pending = false
	now := mono.Now()
	var due []*Tick
	for s.head != nil && s.head.due <= now {
		t := s.head
		s.unlink(t)
		due = append(due, t)
	}
	if s.head != nil {
		s.arm(s.head.due.Sub(now))
	}
	s.mu.Unlock()
	for _, t := range due {
		go s.call(t, t.h)
	}
}

func (s *shard) call(t *Tick, h Handler) {
	s.mu.Lock()
	stopped := t.stopped
	s.mu.Unlock()
	if stopped {
		return
	}
	again := h.Tick()
	s.mu.Lock()
	if again && !t.stopped && !t.queued {
		s.push(t, mono.Now())
	}
	s.mu.Unlock()
}
