package outbox

import (
	"context"
	"time"

	"github.com/idemgo/idem/internal/ctxsleep"
)

// Close releases the driver's listening connection, if any. The pool or DB
// stays open.
func (s *Store) Close() error {
	if s.listen != nil {
		s.listen.Close()
	}
	return nil
}

// listenEarly subscribes to the outbox's notifications before the relay
// looks for due rows, so a row committed between that look and the next
// wait still wakes it — at the start, and after a wait or an error that
// may have lost the listening connection (no round trip while it
// listens). Drivers that cannot listen: nothing to do.
func (s *Store) listenEarly(ctx context.Context) {
	if s.listen != nil {
		_ = s.listen.Listen(ctx, notifyChannel) // on failure, Wait retries and polls meanwhile
	}
}

// wait blocks until a row may be due (a notification) or d passes.
func (s *Store) wait(ctx context.Context, d time.Duration) {
	if s.listen != nil {
		s.listen.Wait(ctx, notifyChannel, d)
		return
	}
	_ = ctxsleep.Sleep(ctx, d)
}
