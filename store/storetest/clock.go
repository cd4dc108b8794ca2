package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// ManualClock is an idem.Clock that moves only when told: the suite's lease
// and retention cases advance it instead of sleeping.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now implements idem.Clock.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// NewClockedStore returns a fresh, isolated store whose time is clock, and
// registers its cleanup on t.
type NewClockedStore func(t testing.TB, clock idem.Clock) store.Store

// RunClocked is Run for stores that take an injected clock (memstore,
// sqlitestore): every case gets a ManualClock of its own, and the lease and
// retention cases advance it instead of sleeping — the cases run in
// microseconds and cannot flake on a loaded machine. Stores that keep time
// on their server (PostgreSQL, Redis) run Run, which sleeps.
func RunClocked(t *testing.T, caps Capabilities, newStore NewClockedStore) {
	Run(t, caps, func(t testing.TB) store.Store {
		clock := NewManualClock(time.Now())
		s := newStore(t, clock)
		clocks.Store(s, clock)
		t.Cleanup(func() { clocks.Delete(s) })
		return s
	})
}

// clocks maps a store under RunClocked to its clock.
var clocks sync.Map // store.Store → *ManualClock

// pass lets d go by for s: advances its clock, or sleeps when its time is
// the wall clock (a server's).
func pass(s store.Store, d time.Duration) {
	if c, ok := clocks.Load(s); ok {
		c.(*ManualClock).Advance(d)
		return
	}
	time.Sleep(d)
}

// now is s's time.
func now(s store.Store) time.Time {
	if c, ok := clocks.Load(s); ok {
		return c.(*ManualClock).Now()
	}
	return time.Now()
}
