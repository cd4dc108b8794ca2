// Package drain waits out the end of a fault campaign: the faults have
// stopped and the work still to do must be done. It waits for as long as
// the work moves, fails once it has not moved for a stated time or at a
// bound that is a multiple of the run's length, and logs the progress curve
// — done and still to do, every ten seconds — so that a backlog being
// worked off and a stall look different in a campaign's log.
package drain

import (
	"fmt"
	"strings"
	"time"
)

// Progress is a campaign's work at one moment: how much is done and how
// much is still to do (keys completed and keys not yet, rows delivered and
// rows pending, credits booked and debits without one).
type Progress struct {
	Done, Left int
}

func (p Progress) String() string { return fmt.Sprintf("%d done, %d to do", p.Done, p.Left) }

// Clock is the time Wait reads and waits on; nil is the real one.
type Clock interface {
	Now() time.Time
	Sleep(d time.Duration)
}

type realClock struct{}

func (realClock) Now() time.Time        { return time.Now() }
func (realClock) Sleep(d time.Duration) { time.Sleep(d) }

// Config says how long to wait.
type Config struct {
	// Stall is how long the work may go without progress (Done rising or
	// Left falling) before Wait gives up: longer than anything the
	// campaign's systems may rightly stall for (a lease, a rebalance, a
	// server's restart). Defaults to a minute.
	Stall time.Duration
	// Bound is the longest Wait waits in all, however the work moves.
	// Defaults to Bound(0).
	Bound time.Duration
	// Every is how often a point of the curve is logged. Defaults to 10s.
	Every time.Duration
	// Poll is how often the progress is measured. Defaults to 200ms.
	Poll time.Duration
	// Logf, if set, hears the curve.
	Logf func(format string, args ...any)
	// Clock defaults to the real one.
	Clock Clock
}

// Bound is the default bound of the drain of a campaign that injected faults
// for run: three times the run, and at least three minutes.
func Bound(run time.Duration) time.Duration { return max(3*run, 3*time.Minute) }

// Result is how a drain ended.
type Result struct {
	// Drained: nothing was left to do.
	Drained bool
	// Why it ended without draining: the work stopped moving, or the
	// bound came.
	Why string
	// First and Last are the progress when the drain started and ended.
	First, Last Progress
	// Took is how long it waited.
	Took time.Duration
	// Curve is the progress measured every Config.Every from the start.
	Curve []Progress
}

// CurveString formats r.Curve, one point per interval every apart:
// "+0s 5400/1200 +10s 5900/700 …" (done/to do).
func (r Result) CurveString(every time.Duration) string {
	var b strings.Builder
	for i, p := range r.Curve {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "+%v %d/%d", time.Duration(i)*every, p.Done, p.Left)
	}
	return b.String()
}

// Wait measures the progress every Config.Poll until nothing is left
// (Result.Drained), the work has not moved for Config.Stall, or
// Config.Bound has passed. A measurement that fails counts as no
// progress; its error is logged.
func Wait(cfg Config, measure func() (Progress, error)) Result {
	if cfg.Stall <= 0 {
		cfg.Stall = time.Minute
	}
	if cfg.Bound <= 0 {
		cfg.Bound = Bound(0)
	}
	if cfg.Every <= 0 {
		cfg.Every = 10 * time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	clock := cfg.Clock
	if clock == nil {
		clock = realClock{}
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	start := clock.Now()
	var r Result
	var best Progress // the most done and the least left seen
	moved := start    // when the work last moved
	nextPoint := start
	measured := false
	var lastErr error
	for {
		now := clock.Now()
		p, err := measure()
		if err != nil {
			lastErr = err
		} else {
			lastErr = nil
			if !measured {
				r.First, best, measured = p, p, true
			}
			if p.Done > best.Done || p.Left < best.Left {
				moved = now
				best.Done, best.Left = max(best.Done, p.Done), min(best.Left, p.Left)
			}
			r.Last = p
		}
		if !now.Before(nextPoint) {
			r.Curve = append(r.Curve, r.Last)
			if lastErr != nil {
				logf("drain +%v: %v (measuring failed: %v)", now.Sub(start).Round(time.Second), r.Last, lastErr)
			} else {
				logf("drain +%v: %v", now.Sub(start).Round(time.Second), r.Last)
			}
			nextPoint = nextPoint.Add(cfg.Every)
		}
		r.Took = now.Sub(start)
		switch {
		case err == nil && p.Left == 0:
			r.Drained = true
			logf("drained in %v: %v", r.Took.Round(time.Millisecond), p)
			return r
		case now.Sub(moved) >= cfg.Stall:
			r.Why = fmt.Sprintf("stalled: no progress for %v, %v (%v after the faults ended)", cfg.Stall, r.Last, r.Took.Round(time.Second))
			if lastErr != nil {
				r.Why += fmt.Sprintf("; measuring failed: %v", lastErr)
			}
			return r
		case r.Took >= cfg.Bound:
			r.Why = fmt.Sprintf("still moving at the bound of %v: %v (a backlog the consumers could not clear, not a stall)", cfg.Bound, r.Last)
			return r
		}
		clock.Sleep(cfg.Poll)
	}
}
