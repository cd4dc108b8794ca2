// Package ticks drives many periodic callbacks of one interval with a single
// timer: the heartbeats of every run in flight on a Guard, or the in-progress
// signals of every message a broker handler holds. Starting and stopping a
// callback is a list insertion and removal under a mutex — no timer, no
// goroutine and no channel per callback; a goroutine is started only when a
// callback is due.
package ticks

import (
	"sync"
	"time"
)

// Scheduler calls each started Tick's handler every interval, measured
// from the end of its previous call, until the Tick is stopped or its
// handler returns false. Calls of different Ticks run concurrently, so a
// slow one delays no other. The zero value is not usable; call New.
type Scheduler struct {
	interval time.Duration

	mu         sync.Mutex
	head, tail *Tick // queued ticks, by due time (all share the interval)
	timer      *time.Timer
	pending    bool // the timer is set, to fire no later than the head is due
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
	due        time.Time
	queued     bool
	stopped    bool
}

// New returns a scheduler of interval (> 0).
func New(interval time.Duration) *Scheduler {
	if interval <= 0 {
		panic("ticks: the interval must be positive")
	}
	return &Scheduler{interval: interval}
}

// Interval returns the scheduler's interval.
func (s *Scheduler) Interval() time.Duration { return s.interval }

// Start schedules h on t, first one interval from now.
func (s *Scheduler) Start(t *Tick, h Handler) {
	s.mu.Lock()
	t.h = h
	t.stopped = false
	s.push(t, time.Now())
	s.mu.Unlock()
}

// Stop ends t: after Stop returns, the handler is not called again, except by a call
// that was already being started (at most one, at the moment Stop is
// called); a call already running finishes on its own.
func (s *Scheduler) Stop(t *Tick) {
	s.mu.Lock()
	t.stopped = true
	if t.queued {
		s.unlink(t)
	}
	s.mu.Unlock()
}

// push queues t at the tail, due one interval after now. Every queued tick
// was queued no later than now with the same interval, so the queue stays
// sorted. Called with s.mu held.
func (s *Scheduler) push(t *Tick, now time.Time) {
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

func (s *Scheduler) unlink(t *Tick) {
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
func (s *Scheduler) arm(d time.Duration) {
	s.pending = true
	if s.timer == nil {
		s.timer = time.AfterFunc(d, s.fire)
		return
	}
	s.timer.Reset(d)
}

// fire takes every due tick off the queue and calls each in its own
// goroutine.
func (s *Scheduler) fire() {
	s.mu.Lock()
	s.pending = false
	now := time.Now()
	var due []*Tick
	for s.head != nil && !s.head.due.After(now) {
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

func (s *Scheduler) call(t *Tick, h Handler) {
	s.mu.Lock()
	stopped := t.stopped
	s.mu.Unlock()
	if stopped {
		return
	}
	again := h.Tick()
	s.mu.Lock()
	if again && !t.stopped && !t.queued {
		s.push(t, time.Now())
	}
	s.mu.Unlock()
}
