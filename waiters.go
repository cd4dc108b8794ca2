package idem

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/internal/ctxsleep"
	"github.com/idemgo/idem/internal/mono"
	"github.com/idemgo/idem/store"
)

// waiters are the duplicates of keys in progress waiting in this Guard
// (RunOptions.WaitInProgress). The waiters of one key share one poll of the
// store — a read, at intervals from 5ms doubling to 200ms — which wakes them
// when the key is no longer held; a settle or release of the key by this
// Guard wakes them at once. Woken, each claims the key once more.
type waiters struct {
	mu     sync.Mutex
	keys   map[string]*keyWaiters
	total  int
	active atomic.Int32 // total, read without the lock: a settle with no waiter anywhere takes no lock
}

// keyWaiters are the waiters of one key.
type keyWaiters struct {
	n    int
	wake chan struct{} // closed when the key may have changed; then replaced
}

// join adds a waiter of skey and returns the channel that wakes it, or nil
// when the caps are reached (the caller answers InProgress).
func (g *Guard) joinWait(skey string) *keyWaiters {
	w := &g.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.keys == nil {
		w.keys = map[string]*keyWaiters{}
	}
	kw := w.keys[skey]
	if w.total >= g.cfg.MaxWaiters || (kw != nil && kw.n >= g.cfg.MaxWaitersPerKey) {
		return nil
	}
	if kw == nil {
		kw = &keyWaiters{wake: make(chan struct{})}
		w.keys[skey] = kw
		go g.pollWait(skey, kw)
	}
	kw.n++
	w.total++
	w.active.Add(1)
	return kw
}

// leaveWait removes a waiter of skey.
func (g *Guard) leaveWait(skey string, kw *keyWaiters) {
	w := &g.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	kw.n--
	w.total--
	w.active.Add(-1)
	if kw.n == 0 && w.keys[skey] == kw {
		delete(w.keys, skey)
	}
}

// wakeWaiters wakes the waiters of skey, if any.
func (g *Guard) wakeWaiters(skey string) {
	w := &g.waits
	if w.active.Load() == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if kw := w.keys[skey]; kw != nil {
		close(kw.wake)
		kw.wake = make(chan struct{})
	}
}

// wakeChan is the channel that wakes kw's waiters now.
func (g *Guard) wakeChan(kw *keyWaiters) <-chan struct{} {
	g.waits.mu.Lock()
	defer g.waits.mu.Unlock()
	return kw.wake
}

// pollWait reads skey at growing intervals while it has waiters and wakes
// them when it is no longer held: settled, released, gone, or its lease
// over (a takeover may claim it).
func (g *Guard) pollWait(skey string, kw *keyWaiters) {
	pause := 5 * time.Millisecond
	for {
		time.Sleep(pause)
		g.waits.mu.Lock()
		alone := g.waits.keys[skey] != kw
		g.waits.mu.Unlock()
		if alone {
			return // no waiter left
		}
		pause = min(2*pause, 200*time.Millisecond)
		rec, err := g.cfg.Store.Get(context.Background(), skey)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			continue // the waiters' own claims will say; keep polling
		case rec.State == store.StateInFlight && g.cfg.Clock.Now().Before(rec.LeaseUntil):
			continue
		}
		g.wakeWaiters(skey)
		pause = 5 * time.Millisecond
	}
}

// waitInProgress waits, while the key is in progress elsewhere and the
// bound lasts (RunOptions.WaitInProgress) and ctx (the wait's context)
// lasts, to be woken — by the key's shared poll or by this Guard settling
// it — then claims it again; acq and sent are the acquisition that found it
// in progress, returned as they are if it still is (or the caps on waiters
// are reached).
func (g *Guard) waitInProgress(ctx, claimCtx context.Context, skey, fp string, until mono.Time, bound time.Duration, acq store.Acquisition, sent mono.Time) (store.Acquisition, mono.Time, error) {
	kw := g.joinWait(skey)
	if kw == nil {
		return acq, sent, nil
	}
	defer g.leaveWait(skey, kw)
	deadline := mono.Now().Add(bound)
	for {
		wake := g.wakeChan(kw)
		// A settle between the claim that found the key in progress and
		// joining was missed: ask once more before sleeping.
		next, nextSent, err := g.acquire(claimCtx, skey, fp, until)
		if err != nil || next.Outcome != store.InProgress {
			return next, nextSent, err
		}
		acq, sent = next, nextSent
		left := deadline.Sub(mono.Now())
		if left <= 0 || ctxsleep.Until(ctx, wake, left) != nil {
			return acq, sent, nil
		}
	}
}
