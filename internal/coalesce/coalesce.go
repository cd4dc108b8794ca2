// Package coalesce joins calls that arrive while a store round trip is in
// flight into the next round trip — group commit, without a timer.
//
// A Group allows a bounded number of round trips in flight. A call that
// finds a free slot and nobody waiting runs alone at once, through the
// single-call function: a lone caller pays no added latency and no batch
// overhead. A call that finds every slot busy waits in a queue; when a
// round trip ends, its slot takes what is waiting (up to MaxBatch, never
// two requests with the same key) and runs it as one batch for everyone,
// on a goroutine of the slot's own, which goes on with the slot's next
// batch while calls wait: every caller, the one whose round trip ended
// included, returns as soon as its own answer is there. A waiting call
// and a batch's buffers are reused: under load a call allocates nothing of
// its own in the group (a batch allocates its context and its watches).
//
// Under load a Group can hold lone calls back (Config.LoneInFlight,
// LoadedAt and MinBatch): while many requests are in it, a lone call would
// spend a whole round trip on one request, so it waits for a batch
// instead, and the queue goes out as soon as it is MinBatch long and a
// slot is free. With Config.FastTrip, a Group times its round trips and
// holds calls back by other settings (Config.Fast) while they are fast:
// where a round trip costs more work than waiting for one (a server on
// the same host), calls then share trips at lower loads, and where the
// network is slow they do not wait for one another.
//
// The batch runs on a context that keeps the first member's values and is
// cancelled only when every member's context is done: one caller giving up
// does not fail the others. A member whose context ends while its batch is
// in flight returns the context's error at once, as a single call would;
// whether its request took effect is then unknown, as for a single call
// cancelled after it was sent.
package coalesce

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Config bounds a Group.
type Config[Req any] struct {
	// MaxBatch bounds the requests of one round trip. Defaults to 64.
	MaxBatch int
	// MaxInFlight bounds the round trips in flight at once (single calls and
	// batches). Defaults to one per two cores: measured on PostgreSQL (2
	// cores, 32 workers), one acquire statement in flight carried 17 calls
	// and made 8,500 lifecycles/s, two carried 14 and made 7,100/s — the
	// statements then compete for the same cores.
	MaxInFlight int
	// Key, when set, names each request's key: two requests with the same
	// key never share a batch (the second waits for the next one), for
	// statements that may touch a row only once.
	Key func(Req) string
	// LoneInFlight bounds, while the group is loaded, the round trips in
	// flight beside which a call still runs alone; past it the call waits
	// for a batch. Defaults to MaxInFlight: a call runs alone whenever a
	// slot is free.
	LoneInFlight int
	// LoadedAt: the group is loaded while at least this many requests are
	// in it, queued or in flight. Defaults to 1.
	LoadedAt int
	// MinBatch, when set, sends the queue at once when it holds this many
	// requests and a slot is free, instead of at the end of a round trip
	// (which still takes whatever waits).
	MinBatch int
	// FastTrip, when set, makes the group time its round trips (from the
	// call or the batch's start to its answer): while their moving average
	// (each trip weighs 1/8) is under FastTrip, Fast's settings apply
	// instead of LoneInFlight, LoadedAt and MinBatch. The average starts at
	// zero: fast.
	FastTrip time.Duration
	// Fast holds calls back while round trips are fast (see FastTrip).
	// Its zero fields default as the Config's own do; its GatherAt has no
	// counterpart among them (slower trips never gather).
	Fast Hold
	// Now reads the clock that times round trips (time.Now when nil).
	Now func() time.Time
}

// Hold says when a call waits for a batch instead of running alone: see
// Config's fields of the same names.
type Hold struct {
	LoneInFlight, LoadedAt, MinBatch int
	// GatherAt, when set, with MinBatch: while at least GatherAt requests
	// are in the group, a queue shorter than MinBatch waits at the end of a
	// round trip if other trips are in flight (it goes out at MinBatch, or
	// at the end of the last trip out).
	GatherAt int
}

// defaults fills h's zero fields (LoneInFlight at most maxInFlight).
func (h Hold) defaults(maxInFlight int) Hold {
	if h.LoneInFlight <= 0 || h.LoneInFlight > maxInFlight {
		h.LoneInFlight = maxInFlight
	}
	if h.LoadedAt <= 0 {
		h.LoadedAt = 1
	}
	return h
}

// Group coalesces calls of one kind.
type Group[Req, Resp any] struct {
	one   func(context.Context, Req) (Resp, error)
	batch func(context.Context, []Req, []Resp, []error)
	cfg   Config[Req]
	own   Hold // the Config's LoneInFlight, LoadedAt and MinBatch
	fast  Hold // Config.Fast

	mu       sync.Mutex
	inFlight int
	queue    []*call[Req, Resp]
	seen     map[string]struct{} // forming a batch, under mu
	flying   int                 // requests in the round trips in flight
	tripAvg  time.Duration       // moving average of round trips (FastTrip)

	batches, batched atomic.Int64
	running          sync.WaitGroup // the goroutines running batches

	// Reused: a call whose caller read its answer (or left the queue before
	// a batch took it), and a batch's buffers once every member is
	// answered. A call answered after its caller gave up is never reused:
	// the batch still writes into it.
	callPool, batchPool sync.Pool
}

type state uint8

const (
	queued state = iota
	taken        // in a batch
)

type call[Req, Resp any] struct {
	ctx   context.Context
	req   Req
	resp  Resp
	err   error
	state state         // under Group.mu
	done  chan struct{} // the answer (buffered: a batch never waits on it)
}

// batch is a batch's calls with the buffers its run needs, reused from
// one batch to the next (Group.batchPool).
type batch[Req, Resp any] struct {
	calls []*call[Req, Resp]
	reqs  []Req
	resps []Resp
	errs  []error
	dones []<-chan struct{} // the members' distinct Done channels
	stops []func() bool
}

// New returns a Group. one runs a request alone; batch runs two or more and
// sets each one's response or error (same index as its request). batch must
// decide every request: a batch that failed as a whole sets every error.
// The three slices are the group's, reused for its next batch: batch must
// not keep them, or hand them to a goroutine that outlives it.
func New[Req, Resp any](cfg Config[Req], one func(context.Context, Req) (Resp, error),
	batch func(ctx context.Context, reqs []Req, resps []Resp, errs []error)) *Group[Req, Resp] {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 64
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = max(1, runtime.NumCPU()/2)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	own := Hold{LoneInFlight: cfg.LoneInFlight, LoadedAt: cfg.LoadedAt, MinBatch: cfg.MinBatch}.defaults(cfg.MaxInFlight)
	return &Group[Req, Resp]{one: one, batch: batch, cfg: cfg, own: own, fast: cfg.Fast.defaults(cfg.MaxInFlight),
		seen: map[string]struct{}{}}
}

// hold returns the settings that apply now. Under g.mu.
func (g *Group[Req, Resp]) hold() *Hold {
	if g.cfg.FastTrip > 0 && g.tripAvg < g.cfg.FastTrip {
		return &g.fast
	}
	return &g.own
}

// start reads the clock at a round trip's start, when trips are timed.
func (g *Group[Req, Resp]) start() time.Time {
	if g.cfg.FastTrip == 0 {
		return time.Time{}
	}
	return g.cfg.Now()
}

// Do runs req alone or in a batch and returns its response.
func (g *Group[Req, Resp]) Do(ctx context.Context, req Req) (Resp, error) {
	g.mu.Lock()
	h := g.hold()
	if g.inFlight < g.cfg.MaxInFlight && len(g.queue) == 0 &&
		(g.inFlight < h.LoneInFlight || !g.loaded(h)) {
		g.inFlight++
		g.flying++
		g.mu.Unlock()
		defer g.endLone(g.start()) // also if one panics: the slot passes on
		return g.one(ctx, req)
	}
	c, _ := g.callPool.Get().(*call[Req, Resp])
	if c == nil {
		c = &call[Req, Resp]{done: make(chan struct{}, 1)}
	}
	c.ctx, c.req, c.state = ctx, req, queued
	g.queue = append(g.queue, c)
	if h.MinBatch > 0 && len(g.queue) >= h.MinBatch && g.inFlight < g.cfg.MaxInFlight {
		g.inFlight++
		b := g.take()
		g.mu.Unlock()
		g.runAll(b)
	} else {
		g.mu.Unlock()
	}

	select {
	case <-c.done:
		resp, err := c.resp, c.err
		g.recycle(c)
		return resp, err
	case <-ctx.Done():
	}
	g.mu.Lock()
	left := c.state == queued
	if left {
		g.remove(c)
	}
	g.mu.Unlock()
	if left {
		g.recycle(c)
	}
	var zero Resp
	return zero, ctx.Err() // a batch that took c answers into a buffered channel no one reads
}

// recycle puts c back for another call, holding nothing of this one.
func (g *Group[Req, Resp]) recycle(c *call[Req, Resp]) {
	var zeroReq Req
	var zeroResp Resp
	c.ctx, c.req, c.resp, c.err = nil, zeroReq, zeroResp, nil
	g.callPool.Put(c)
}

// Sum adds the Stats of groups.
func Sum(groups ...interface{ Stats() (int64, int64) }) (batches, requests int64) {
	for _, g := range groups {
		b, r := g.Stats()
		batches, requests = batches+b, requests+r
	}
	return batches, requests
}

// Stats returns the batches run and the requests they carried.
func (g *Group[Req, Resp]) Stats() (batches, requests int64) {
	return g.batches.Load(), g.batched.Load()
}

func (g *Group[Req, Resp]) remove(c *call[Req, Resp]) {
	for i, q := range g.queue {
		if q == c {
			n := copy(g.queue[i:], g.queue[i+1:])
			g.queue[i+n] = nil // let c go
			g.queue = g.queue[:i+n]
			return
		}
	}
}

// loaded says whether h.LoadedAt requests are in the group, queued or in
// flight. Under g.mu.
func (g *Group[Req, Resp]) loaded(h *Hold) bool { return g.flying+len(g.queue) >= h.LoadedAt }

// endLone ends a lone call's round trip, started at start: its slot
// runs what is waiting, on a goroutine of its own, or is freed.
func (g *Group[Req, Resp]) endLone(start time.Time) {
	if b := g.next(1, start); b != nil {
		g.runAll(b)
	}
}

// next ends a round trip that started at start and carried ended
// requests, and returns the batch its slot runs next, or nil when it frees
// the slot.
func (g *Group[Req, Resp]) next(ended int, start time.Time) *batch[Req, Resp] {
	var took time.Duration
	if g.cfg.FastTrip > 0 {
		took = g.cfg.Now().Sub(start)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cfg.FastTrip > 0 {
		g.tripAvg += (took - g.tripAvg) / 8
	}
	g.flying -= ended
	if h := g.hold(); len(g.queue) == 0 || h.GatherAt > 0 && g.flying+len(g.queue) >= h.GatherAt && g.inFlight > 1 && len(g.queue) < h.MinBatch {
		g.inFlight--
		return nil
	}
	return g.take()
}

// take takes what is waiting as one batch, for a slot already counted in
// g.inFlight. Under g.mu.
func (g *Group[Req, Resp]) take() *batch[Req, Resp] {
	b, _ := g.batchPool.Get().(*batch[Req, Resp])
	if b == nil {
		b = &batch[Req, Resp]{}
	}
	rest := g.queue[:0]
	for _, c := range g.queue {
		if len(b.calls) == g.cfg.MaxBatch {
			rest = append(rest, c)
			continue
		}
		if g.cfg.Key != nil {
			k := g.cfg.Key(c.req)
			if _, dup := g.seen[k]; dup {
				rest = append(rest, c)
				continue
			}
			g.seen[k] = struct{}{}
		}
		c.state = taken
		b.calls = append(b.calls, c)
	}
	g.flying += len(b.calls)
	clear(g.queue[len(rest):])
	g.queue = rest
	clear(g.seen)
	return b
}

// runAll runs b on a goroutine of its own, then, on the same goroutine
// (its stack already grown to a round trip's needs), each batch its slot
// takes after it, until the slot is freed.
func (g *Group[Req, Resp]) runAll(b *batch[Req, Resp]) {
	g.running.Add(1) // before this slot's goroutine ends (see Wait)
	go func() {
		defer g.running.Done()
		for b != nil {
			start := g.start()
			n := len(b.calls)
			g.run(b)
			b = g.next(n, start)
		}
	}()
}

// Wait returns when no batch is running: a batch whose callers all gave up
// goes on to its end, and the connection it holds should not be closed
// under it. Calls that start meanwhile are not waited for.
func (g *Group[Req, Resp]) Wait() { g.running.Wait() }

// run runs a batch on a context that ends when every member's has, and
// answers each member; then it puts b back for another batch.
func (g *Group[Req, Resp]) run(b *batch[Req, Resp]) {
	defer g.reuse(b)
	if len(b.calls) == 1 {
		c := b.calls[0]
		c.resp, c.err = g.one(c.ctx, c.req)
		c.done <- struct{}{}
		return
	}
	g.batches.Add(1)
	g.batched.Add(int64(len(b.calls)))
	ctx, cancel := context.WithCancel(context.WithoutCancel(b.calls[0].ctx))
	defer cancel()
	// Members whose contexts share a Done channel end together: one
	// AfterFunc watches them all (many callers often share one context).
	// A member whose context never ends keeps the batch from being cancelled.
	if !slices.ContainsFunc(b.calls, func(c *call[Req, Resp]) bool { return c.ctx.Done() == nil }) {
		var live atomic.Int64
		live.Store(1) // held until every watch is set
		end := func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		}
		for _, c := range b.calls {
			if d := c.ctx.Done(); !slices.Contains(b.dones, d) {
				b.dones = append(b.dones, d)
				live.Add(1)
				b.stops = append(b.stops, context.AfterFunc(c.ctx, end))
			}
		}
		end()
	}
	for _, c := range b.calls {
		b.reqs = append(b.reqs, c.req)
	}
	b.resps = slices.Grow(b.resps, len(b.calls))[:len(b.calls)]
	b.errs = slices.Grow(b.errs, len(b.calls))[:len(b.calls)]
	g.batch(ctx, b.reqs, b.resps, b.errs)
	for _, stop := range b.stops {
		stop()
	}
	for i, c := range b.calls {
		c.resp, c.err = b.resps[i], b.errs[i]
		c.done <- struct{}{}
	}
}

// reuse empties b (holding nothing of its calls) and puts it back.
func (g *Group[Req, Resp]) reuse(b *batch[Req, Resp]) {
	clear(b.calls)
	clear(b.reqs)
	clear(b.resps)
	clear(b.errs)
	clear(b.dones)
	clear(b.stops)
	b.calls, b.reqs, b.resps, b.errs, b.dones, b.stops = b.calls[:0], b.reqs[:0], b.resps[:0], b.errs[:0], b.dones[:0], b.stops[:0]
	g.batchPool.Put(b)
}
