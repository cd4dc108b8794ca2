package drain

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// fakeClock advances only when Wait sleeps.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time        { return c.now }
func (c *fakeClock) Sleep(d time.Duration) { c.now = c.now.Add(d) }

// script returns a measure that answers f(elapsed) on clock c.
func script(c *fakeClock, f func(elapsed time.Duration) (Progress, error)) func() (Progress, error) {
	start := c.now
	return func() (Progress, error) { return f(c.now.Sub(start)) }
}

func TestDrainedWhileMoving(t *testing.T) {
	c := &fakeClock{now: time.Unix(0, 0)}
	// 1,000 left, one done a second: a backlog of 1,000 s, longer than
	// Stall many times over, but moving all the while.
	r := Wait(Config{Stall: 30 * time.Second, Bound: time.Hour, Clock: c}, script(c, func(e time.Duration) (Progress, error) {
		done := min(int(e/time.Second), 1000)
		return Progress{Done: done, Left: 1000 - done}, nil
	}))
	if !r.Drained || r.Why != "" {
		t.Fatalf("a moving backlog did not drain: %+v", r)
	}
	if r.Took != 1000*time.Second || r.First != (Progress{0, 1000}) || r.Last != (Progress{1000, 0}) {
		t.Fatalf("took %v from %v to %v, want 1000s from 0/1000 to 1000/0", r.Took, r.First, r.Last)
	}
	if len(r.Curve) != 101 || r.Curve[50] != (Progress{500, 500}) {
		t.Fatalf("curve of %d points, the 51st %v; want 101 points, the 51st 500/500", len(r.Curve), r.Curve[50])
	}
}

func TestStalled(t *testing.T) {
	c := &fakeClock{now: time.Unix(0, 0)}
	// Moves for 20 s, then stops with 80 left.
	r := Wait(Config{Stall: 30 * time.Second, Bound: time.Hour, Clock: c}, script(c, func(e time.Duration) (Progress, error) {
		done := min(int(e/time.Second), 20)
		return Progress{Done: done, Left: 100 - done}, nil
	}))
	if r.Drained || !strings.HasPrefix(r.Why, "stalled") {
		t.Fatalf("a stall was not reported as one: %+v", r)
	}
	// Last progress at 20 s; stalled 30 s later.
	if r.Took != 50*time.Second || r.Last != (Progress{20, 80}) {
		t.Fatalf("stalled after %v at %v, want 50s at 20/80", r.Took, r.Last)
	}
}

func TestBound(t *testing.T) {
	c := &fakeClock{now: time.Unix(0, 0)}
	r := Wait(Config{Stall: 30 * time.Second, Bound: 100 * time.Second, Clock: c}, script(c, func(e time.Duration) (Progress, error) {
		done := int(e / time.Second)
		return Progress{Done: done, Left: 1000 - done}, nil
	}))
	if r.Drained || !strings.HasPrefix(r.Why, "still moving at the bound") || r.Took != 100*time.Second {
		t.Fatalf("the bound did not end the drain at 100s: %+v", r)
	}
}

// A failing measurement is no progress: the drain stalls through errors,
// and says why.
func TestMeasuringFails(t *testing.T) {
	c := &fakeClock{now: time.Unix(0, 0)}
	var logged []string
	r := Wait(Config{Stall: 30 * time.Second, Clock: c, Logf: func(f string, a ...any) { logged = append(logged, f) }},
		script(c, func(e time.Duration) (Progress, error) {
			if e < 5*time.Second {
				return Progress{Done: 1, Left: 5}, nil
			}
			return Progress{}, errors.New("connection refused")
		}))
	if r.Drained || !strings.Contains(r.Why, "connection refused") || r.Last != (Progress{1, 5}) {
		t.Fatalf("a failing measurement: %+v", r)
	}
	if len(logged) == 0 {
		t.Fatal("no curve logged")
	}
}

// Progress is the most done or the least left seen: a count going back
// and forth (a row pending again after a failed send) is not progress.
func TestNoProgressBackAndForth(t *testing.T) {
	c := &fakeClock{now: time.Unix(0, 0)}
	r := Wait(Config{Stall: 30 * time.Second, Clock: c}, script(c, func(e time.Duration) (Progress, error) {
		if int(e/time.Second)%2 == 0 {
			return Progress{Done: 10, Left: 5}, nil
		}
		return Progress{Done: 9, Left: 6}, nil
	}))
	if r.Drained || !strings.HasPrefix(r.Why, "stalled") || r.Took != 30*time.Second {
		t.Fatalf("back and forth counted as progress: %+v", r)
	}
}

func TestCurveString(t *testing.T) {
	r := Result{Curve: []Progress{{0, 10}, {5, 5}, {10, 0}}}
	if got, want := r.CurveString(10*time.Second), "+0s 0/10 +10s 5/5 +20s 10/0"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
