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
