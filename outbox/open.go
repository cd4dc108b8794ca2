package outbox

import (
	"context"
	"time"
)

// Close releases the driver's listening connection, if any. The pool or DB
// stays open.
func (s *Store) Close() error {
	if s.listen != nil {
		s.listen.Close()
	}
	return nil
}

// wait blocks until a row may be due (a notification, true) or d passes.
func (s *Store) wait(ctx context.Context, d time.Duration) {
	if s.listen != nil {
		s.listen.Wait(ctx, notifyChannel, d)
		return
	}
	sleep(ctx, d)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
