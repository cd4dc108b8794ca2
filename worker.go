package idem

import (
	"context"
	"errors"
	"sync"
)

// Worker is the Start/Stop contract shared by idem's background workers
// (Sweeper, outbox.Relay): Start runs one loop in a goroutine until Stop or
// its context ends; Stop waits for the loop to return (it finishes the work
// in hand) or for its own context to end. The zero value is ready.
type Worker struct {
	mu   sync.Mutex
	stop context.CancelFunc
	done chan struct{}
}

// Start runs loop in a goroutine with a context that ends at Stop. Starting
// a started worker is an error.
func (w *Worker) Start(ctx context.Context, loop func(ctx context.Context)) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != nil {
		return errors.New("idem: worker already started")
	}
	ctx, cancel := context.WithCancel(ctx)
	w.stop, w.done = cancel, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		loop(ctx)
	}(w.done)
	return nil
}

// Stop ends the loop and waits for it, or for ctx. Stopping a stopped
// worker does nothing.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	stop, done := w.stop, w.done
	w.stop, w.done = nil, nil
	w.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
