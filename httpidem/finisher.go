package httpidem

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// errClientGone is why a handler is cancelled FinishTimeout after its
// client left.
var errClientGone = errors.New("idem/httpidem: the client left and the handler did not finish within FinishTimeout")

// finisher is the context a request with a key runs under: the client's
// (the request's) values without its cancellation, so that the client
// leaving neither stops the lease's heartbeats nor hides the Guard's own
// cancellations (a refused heartbeat, a lease run out) from the handler;
// cancelled timeout after the client left (expired then reports true), and
// when the request ends (stop).
//
// It watches the client only once something waits on it (Done, a context
// made from it, Err once the client is gone): a request whose handler and
// store never wait costs no registration on the client's context. A client
// found gone at that first look starts the timeout then.
type finisher struct {
	values  atomic.Value // context.Context: the client's without its cancellation, made at the first Value
	client  context.Context
	timeout time.Duration

	mu       sync.Mutex
	done     chan struct{} // made on first Done
	err      error         // context.Canceled once cancelled
	expired  bool          // cancelled by the timeout
	watching bool
	unwatch  func() bool // ends the watch of the client
	timer    *time.Timer
	funcs    map[*func()]struct{} // AfterFunc's, run once cancelled
}

// finishWithoutClient returns the finisher of a request whose context is
// client.
func finishWithoutClient(client context.Context, timeout time.Duration) *finisher {
	return &finisher{client: client, timeout: timeout}
}

func (f *finisher) Deadline() (time.Time, bool) { return time.Time{}, false }

// Value looks key up in the client's context without its cancellation
// (context.WithoutCancel, made once something asks: a request answered
// from the store, whose handler never runs, may never ask).
func (f *finisher) Value(key any) any {
	v, _ := f.values.Load().(context.Context)
	if v == nil {
		f.values.CompareAndSwap(nil, context.WithoutCancel(f.client))
		v = f.values.Load().(context.Context)
	}
	return v.Value(key)
}

func (f *finisher) Done() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done == nil {
		f.done = make(chan struct{})
		if f.err != nil {
			close(f.done)
		}
	}
	f.watch()
	return f.done
}

// Err starts the watch only if the client is gone already: a look that
// does not wait (a store checking its caller's context before a call)
// costs no registration.
func (f *finisher) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.watching && f.err == nil && f.client.Err() != nil {
		f.watch()
	}
	return f.err
}

// AfterFunc runs fn once f is cancelled (as context.AfterFunc does): the
// context package uses it for contexts made from f, instead of a goroutine
// each.
func (f *finisher) AfterFunc(fn func()) (stop func() bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		go fn()
		return func() bool { return false }
	}
	f.watch()
	if f.funcs == nil {
		f.funcs = make(map[*func()]struct{}, 1)
	}
	p := &fn
	f.funcs[p] = struct{}{}
	return func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, ok := f.funcs[p]
		delete(f.funcs, p)
		return ok
	}
}

// watch starts watching the client, once, while f is not cancelled. Called
// with f.mu held.
func (f *finisher) watch() {
	if f.watching || f.err != nil {
		return
	}
	f.watching = true
	if f.client.Done() != nil {
		f.unwatch = context.AfterFunc(f.client, f.clientLeft)
	}
}

func (f *finisher) clientLeft() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.timer = time.AfterFunc(f.timeout, f.expire)
	}
}

func (f *finisher) expire() { f.cancel(true) }

// cancel cancels f, by the timeout or at the request's end.
func (f *finisher) cancel(expired bool) {
	f.mu.Lock()
	if f.err != nil {
		f.mu.Unlock()
		return
	}
	f.err, f.expired = context.Canceled, expired
	if f.done != nil {
		close(f.done)
	}
	funcs := f.funcs
	f.funcs = nil
	f.mu.Unlock()
	for p := range funcs {
		go (*p)()
	}
}

// clientGone reports whether f was cancelled because its client left and
// the timeout ran out.
func (f *finisher) clientGone() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.expired
}

// stop cancels f at the request's end and ends the watch and the timer.
func (f *finisher) stop() {
	f.cancel(false)
	f.mu.Lock()
	unwatch, timer := f.unwatch, f.timer
	f.mu.Unlock()
	if unwatch != nil {
		unwatch()
	}
	if timer != nil {
		timer.Stop()
	}
}
