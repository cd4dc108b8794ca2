// Package ctxsleep waits for a duration or until a context ends, whichever
// comes first: the pause of a retry or poll loop.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx ends; it returns ctx.Err() in the second
// case and nil in the first. The timer is stopped either way.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Until waits for d, until wake is closed, or until ctx ends; it returns
// ctx.Err() in the last case and nil otherwise.
func Until(ctx context.Context, wake <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-wake:
		return nil
	case <-t.C:
		return nil
	}
}

// The pauses of Retry: the first, doubling up to the longest.
const (
	firstPause   = 10 * time.Millisecond
	longestPause = time.Second
)

// Retry calls try until it returns false, pausing 10 ms before the second
// call and twice as long before each next one (at most 1 s), as long as
// deadline() lasts and ctx too: a pause that would end past the deadline
// is cut to end there, for a last call at the deadline (a caller retrying
// until its lease ends uses the whole lease). deadline is asked before each
// pause, so it may move; a pause is cut short only once in a row.
func Retry(ctx context.Context, deadline func() time.Time, try func() (again bool)) {
	RetryPausing(ctx, deadline, longestPause, try)
}

// RetryPausing is Retry with the pauses growing to longest instead of 1 s
// (a pause never shorter than 10 ms): for a caller whose deadline moves
// only if it is tried at least every so often.
func RetryPausing(ctx context.Context, deadline func() time.Time, longest time.Duration, try func() (again bool)) {
	longest = max(longest, firstPause)
	pause, cut := firstPause, false
	for try() {
		wait := pause
		switch left := time.Until(deadline()); {
		case left >= pause:
			cut = false
		case left > 0 && !cut:
			wait, cut = left, true
		default:
			return
		}
		if Sleep(ctx, wait) != nil {
			return
		}
		pause = min(2*pause, longest)
	}
}
