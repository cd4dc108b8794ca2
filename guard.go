package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/internal/ctxsleep"
	"github.com/idemgo/idem/internal/mono"
	"github.com/idemgo/idem/internal/ticks"
	"github.com/idemgo/idem/store"
)

// Config configures a Guard. The zero value of every field but Store works.
type Config struct {
	// Store holds the records. Required.
	Store store.Store
	// Lease is how long a claim lives without a heartbeat. Defaults to 30s.
	Lease time.Duration
	// Retention is how long a completed record (and its result) is replayed.
	// Defaults to 24h.
	Retention time.Duration
	// FailureRetention is how long a definite failure is replayed. Defaults
	// to Retention.
	FailureRetention time.Duration
	// MaxAttempts poisons a key after this many acquisitions (first run,
	// re-runs after a release, takeovers). Defaults to 0: no limit.
	MaxAttempts int
	// HeartbeatInterval is how often a running work extends its lease.
	// Defaults to Lease/3; a negative value disables heartbeats: the work
	// then has the lease its acquisition took, and no more.
	//
	// Work whose lease runs out — because no heartbeat reached the store in
	// time (the store unreachable or too slow), or, without heartbeats,
	// because the work ran longer than the lease — has its context
	// cancelled with cause ErrLeaseExpired, ahead of the moment another
	// process could take the key over: the lease is counted on this
	// process's monotonic clock from when the acquisition or the last
	// successful heartbeat was sent (the store started the lease later), less
	// a margin of a tenth of the lease (at most half of Lease less
	// HeartbeatInterval) for the timer and the work to react. Without
	// heartbeats the watch starts when the work first asks for its
	// context's Done or Err (work that never looks cannot be stopped, and
	// a short run needs no timer), and the context's Deadline is that end.
	HeartbeatInterval time.Duration
	// CompactKeys stores SHA-256/128 of the key instead of the raw key
	// (see CompactKey). Defaults to false.
	CompactKeys bool
	// CacheSize enables an in-process cache of up to this many completed or
	// failed records in front of the store. Defaults to 0: no cache. A cached
	// record is replayed without a round trip for up to CacheTTL even if it
	// is deleted from the store meanwhile.
	CacheSize int
	// CacheTTL bounds how long a cached record is served. Defaults to 1m.
	CacheTTL time.Duration
	// Classify maps the work's error to a Disposition. Defaults to
	// DefaultClassify.
	Classify func(error) Disposition
	// Clock tells the guard's time (cache expiry, event durations). Defaults
	// to the wall clock. Leases use the store's clock.
	Clock Clock
	// Observer, if set, receives one Event per phase — per try of a settle
	// tried again (see Run) and per heartbeat — synchronously: keep it fast
	// (update metrics, write a log line).
	Observer func(Event)
	// Tracer, if set, traces every Run (and Do): otelidem.Tracing gives
	// one over OpenTelemetry. Nil costs nothing.
	Tracer Tracer
	// MaxWaitersPerKey and MaxWaiters bound the duplicates waiting
	// (RunOptions.WaitInProgress) for one key and in all; one more is
	// answered InProgress at once. Default to 64 and 4,096.
	MaxWaitersPerKey, MaxWaiters int
}

// Tracer traces guarded calls; the idem package knows no tracing library
// (otelidem implements it over OpenTelemetry).
type Tracer interface {
	// Start starts the span of a Run of key in ctx and returns the
	// context the Run continues in — the work's spans are children of
	// it — and the function that ends the span with the Run's result
	// (outcome, fence, disposition, the record's attempts) and error.
	Start(ctx context.Context, key Key) (context.Context, func(Result, error))
}

// Event reports one phase of a guarded call to Config.Observer.
type Event struct {
	// Phase is "acquire", "settle" or "heartbeat".
	Phase string
	// Key is the storage key.
	Key string
	// Outcome is set on "acquire".
	Outcome store.Outcome
	// Cached is true when the acquire was answered by the in-process cache.
	Cached bool
	// Disposition is set on "settle".
	Disposition Disposition
	// Fence of the owner, when there is one.
	Fence uint64
	// Duration of the store operation.
	Duration time.Duration
	// Err is the store's error, if any.
	Err error
}

// Guard runs work at most once per key (per retention window): the four
// phases of the Idempotent Receiver around a function. It is safe for
// concurrent use.
type Guard struct {
	cfg   Config
	cache *cache
	beats *ticks.Scheduler // nil when heartbeats are off

	decoded decodedValues // idem.Do's decoded results
	waits   waiters       // duplicates waiting for keys in progress
}

// NewGuard validates cfg, applies the defaults and returns a Guard. Errors
// name the offending field.
func NewGuard(cfg Config) (*Guard, error) {
	if cfg.Store == nil {
		return nil, errors.New("idem: Config.Store is required")
	}
	if cfg.Lease == 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.Retention == 0 {
		cfg.Retention = 24 * time.Hour
	}
	if cfg.FailureRetention == 0 {
		cfg.FailureRetention = cfg.Retention
	}
	if cfg.MaxWaitersPerKey <= 0 {
		cfg.MaxWaitersPerKey = 64
	}
	if cfg.MaxWaiters <= 0 {
		cfg.MaxWaiters = 4096
	}
	var lim store.Limits
	if err := lim.CheckLease(cfg.Lease); err != nil {
		return nil, fmt.Errorf("idem: Config.Lease: %w", err)
	}
	if err := lim.CheckRetention(cfg.Retention); err != nil {
		return nil, fmt.Errorf("idem: Config.Retention: %w", err)
	}
	if err := lim.CheckRetention(cfg.FailureRetention); err != nil {
		return nil, fmt.Errorf("idem: Config.FailureRetention: %w", err)
	}
	if cfg.MaxAttempts < 0 {
		return nil, fmt.Errorf("idem: Config.MaxAttempts is %d: must be 0 (no limit) or positive", cfg.MaxAttempts)
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = cfg.Lease / 3
	}
	if cfg.HeartbeatInterval >= cfg.Lease {
		return nil, fmt.Errorf("idem: Config.HeartbeatInterval %v must be shorter than Config.Lease %v", cfg.HeartbeatInterval, cfg.Lease)
	}
	if cfg.CacheSize < 0 {
		return nil, fmt.Errorf("idem: Config.CacheSize is %d: must not be negative", cfg.CacheSize)
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = time.Minute
	}
	if cfg.Classify == nil {
		cfg.Classify = DefaultClassify
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	g := &Guard{cfg: cfg}
	if cfg.HeartbeatInterval > 0 {
		g.beats = ticks.New(cfg.HeartbeatInterval)
	}
	if cfg.CacheSize > 0 {
		g.cache = newCache(cfg.CacheSize, cfg.CacheTTL)
	}
	return g, nil
}

// Store returns the guard's store.
func (g *Guard) Store() store.Store { return g.cfg.Store }

// Retention is how long the guard's completed records are replayed.
func (g *Guard) Retention() time.Duration { return g.cfg.Retention }

// StorageKey returns the string the guard's store indexes for k.
func (g *Guard) StorageKey(k Key) string { return k.Storage(g.cfg.CompactKeys) }

// RunOptions are per-call options; nil means none.
type RunOptions struct {
	// Fingerprint of the request (see Fingerprint). Same key with another
	// fingerprint is a Mismatch, never a replay.
	Fingerprint string
	// Progress, if set, is called after every heartbeat that extended the
	// lease while the work runs — to tell a broker the message is still in
	// progress, on the same schedule. Keep it fast.
	Progress func()
	// WaitInProgress, if positive, makes a duplicate of a key in progress
	// wait up to this long for the run that holds it, then returns the
	// replay once the run settled — or runs the work itself if that run
	// released the key. The duplicates waiting for one key in a Guard
	// share one poll of the store (a read, at intervals from 5ms doubling
	// to 200ms), and are woken at once when this Guard settles the key;
	// woken, each claims it once. Past the bound, when WaitContext (or
	// ctx) ends, or past Config.MaxWaitersPerKey or Config.MaxWaiters, it
	// returns InProgress, as without the option.
	WaitInProgress time.Duration
	// WaitContext, if set, ends the wait of WaitInProgress when it ends:
	// the context of the client the answer is for (an HTTP request's),
	// where ctx outlives it. Defaults to ctx.
	WaitContext context.Context
	// LeaseDeadline, if set, is a time the claim must not outlive: the
	// acquisition and every heartbeat take a lease of Config.Lease or, if
	// shorter, up to LeaseDeadline, and the work's context ends there (by
	// this process's count, as at the end of any lease). For a process that
	// may be stopped at a known time without a chance to settle — a Lambda
	// invocation's deadline — so that its claims end when it does. With no
	// time left before it, Run claims nothing and returns ErrLeaseExpired.
	LeaseDeadline time.Time
}

// Work is the guarded function. fence is the owner's fencing token: a
// business write can be conditioned on it (WHERE fence < $fence) so that a
// zombie owner's late write loses.
type Work func(ctx context.Context, fence uint64) ([]byte, error)

// Result is what Run did.
type Result struct {
	// Outcome of the acquisition.
	Outcome store.Outcome
	// Fence held while the work ran (when Outcome.Owns()).
	Fence uint64
	// Value is the work's result (when it ran and succeeded) or the stored
	// result (Replayed).
	Value []byte
	// Failed is true when Value is a stored definite failure (Replayed), or
	// the work just failed definitely.
	Failed bool
	// Disposition applied after the work ran.
	Disposition Disposition
	// Record is the record the acquisition found or left (zero for a cache hit
	// other than Key, State, Fingerprint, Result).
	Record store.Record
	// Cached is true when the answer came from the in-process cache.
	Cached bool
}

// Run executes the four phases for key: it validates the key, interrogates
// and claims it in the store, runs work only when it holds the claim
// (Outcome Acquired or TakenOver), heartbeats while work runs, and settles the
// record according to Config.Classify.
//
// A duplicate is reported in Result.Outcome with a nil error: InProgress,
// Replayed (Value holds the stored result), Mismatch or Poisoned. The error is
// non-nil for invalid input, a store failure (no work runs without a claim:
// the guard fails closed), a claim whose answer came after its lease would
// have ended (ErrLeaseExpired, the Result empty as for a store failure:
// another owner may hold the key by then, so the work does not run and the
// claim ends with its lease), or the work's own error, which Run returns after
// settling — unchanged, unless the Guard had cancelled the work's context
// because its lease was lost (ErrStaleFence) or ran out (ErrLeaseExpired):
// then with that reason joined (errors.Is finds both; Config.Classify sees
// the work's error alone). A completion or a failure that cannot reach the
// store is tried again, with backoff, as long as the claim lasts — left in
// flight, the record would be run again by the next delivery once its lease
// ends: until the lease ends by the Guard's count (see
// Config.HeartbeatInterval), and, with heartbeats on and while ctx lasts,
// for as long as the store takes the heartbeats sent between the tries (a
// tiered store whose cold tier is out of reach or slow takes them: the
// settle lands once it is back). So Run may wait a lease on a store out of
// reach, and for as long as ctx lets it on a store that keeps the claim but
// refuses the settle. With heartbeats on, an outage of the store shorter
// than the lease less its margin, one HeartbeatInterval (the heartbeat due
// as the store goes may fail), one pause of the settle's backoff (up to a
// HeartbeatInterval, at most a second) and a round trip does not cost a
// settle: about 16 s with the defaults (the Guard campaigns check it with
// a 3 s Lease and 100 ms for the round trip: 1.1 s). If the work succeeded
// but the record could not be settled, Run returns the value with an error
// saying so.
//
// If work panics, the record is held (the effect may have happened) and the
// panic continues.
func (g *Guard) Run(ctx context.Context, key Key, opts *RunOptions, work Work) (Result, error) {
	if g.cfg.Tracer == nil {
		return g.run(ctx, key, opts, work)
	}
	ctx, end := g.cfg.Tracer.Start(ctx, key)
	res, err := g.run(ctx, key, opts, work)
	end(res, err)
	return res, err
}

func (g *Guard) run(ctx context.Context, key Key, opts *RunOptions, work Work) (Result, error) {
	if err := key.Validate(); err != nil {
		return Result{}, err
	}
	var fp string
	var progress func()
	var wait time.Duration
	var until mono.Time // 0: no LeaseDeadline
	waitCtx := ctx
	if opts != nil {
		fp, progress, wait = opts.Fingerprint, opts.Progress, opts.WaitInProgress
		if opts.WaitContext != nil {
			waitCtx = opts.WaitContext
		}
		if !opts.LeaseDeadline.IsZero() {
			until = max(mono.Now().Add(time.Until(opts.LeaseDeadline)), 1)
		}
	}
	skey := key.Storage(g.cfg.CompactKeys)

	if g.cache != nil {
		if rec, ok := g.cache.get(skey, g.cfg.Clock.Now()); ok {
			rec.Result = bytes.Clone(rec.Result) // the caller's to modify: the cache keeps its own
			res := Result{Outcome: store.Replayed, Value: rec.Result, Failed: rec.State == store.StateFailed, Record: rec, Cached: true}
			if rec.Fingerprint != fp {
				res = Result{Outcome: store.Mismatch, Record: rec, Cached: true}
			}
			g.observe(Event{Phase: "acquire", Key: skey, Outcome: res.Outcome, Cached: true})
			return res, nil
		}
	}

	acq, sent, err := g.acquire(ctx, skey, fp, until)
	if err == nil && acq.Outcome == store.InProgress && wait > 0 {
		acq, sent, err = g.waitInProgress(waitCtx, ctx, skey, fp, until, wait, acq, sent)
	}
	if err != nil {
		return Result{}, fmt.Errorf("idem: acquire %s: %w", key, err)
	}
	res := Result{Outcome: acq.Outcome, Fence: acq.Fence, Record: acq.Record}
	switch acq.Outcome {
	case store.Acquired, store.TakenOver:
	case store.Replayed:
		res.Value = acq.Record.Result
		res.Failed = acq.Record.State == store.StateFailed
		if g.cache != nil {
			g.cache.put(acq.Record, g.cfg.Clock.Now())
		}
		return res, nil
	default:
		return res, nil
	}

	answered := mono.Now()
	if late := answered.Sub(sent); late >= g.cfg.Lease-g.leaseMargin() || until != 0 && answered >= until {
		// The answer came after the lease would have ended (by this
		// process's count): another owner may hold the key by now. The work
		// does not run; the claim ends with its lease.
		return Result{}, fmt.Errorf("idem: acquire %s: the store answered after %v, past the %v lease: %w", key, late.Round(time.Millisecond), g.cfg.Lease, ErrLeaseExpired)
	}
	value, workErr, leaseEnd, lost := g.runOwned(ctx, skey, acq.Fence, sent, answered, until, progress, work)
	disp := classify(g.cfg.Classify, workErr)
	res.Disposition = disp
	res.Value = value
	settleErr := g.settle(ctx, skey, acq.Fence, disp, value, workErr, &res, leaseEnd, until)
	if settleErr == nil && disp != Hold {
		g.wakeWaiters(skey) // the duplicates waiting here need no poll to see it
	}
	if workErr != nil && lost != nil && !errors.Is(workErr, lost) {
		workErr = fmt.Errorf("%w (%w)", workErr, lost) // why its context ended
	}
	if workErr != nil {
		if settleErr != nil {
			return res, errors.Join(workErr, settleErr)
		}
		return res, workErr
	}
	return res, settleErr
}

// acquire asks the store for the key once, and says when it sent the
// request (the lease starts no earlier: see HeartbeatInterval). until,
// if not 0, bounds the lease (RunOptions.LeaseDeadline).
func (g *Guard) acquire(ctx context.Context, skey, fp string, until mono.Time) (store.Acquisition, mono.Time, error) {
	start := g.startTiming()
	sent := mono.Now()
	lease := g.leaseBefore(until, sent)
	if lease < time.Millisecond {
		return store.Acquisition{}, sent, fmt.Errorf("no time left for a lease before the run's LeaseDeadline: %w", ErrLeaseExpired)
	}
	acq, err := g.cfg.Store.Acquire(ctx, store.AcquireRequest{
		Key:         skey,
		Fingerprint: fp,
		Lease:       lease,
		Retention:   g.cfg.Retention,
		MaxAttempts: g.cfg.MaxAttempts,
	})
	g.observe(Event{Phase: "acquire", Key: skey, Outcome: acq.Outcome, Fence: acq.Fence, Duration: g.since(start), Err: err})
	return acq, sent, err
}

// leaseBefore is the lease to take at now: Config.Lease, or less to end at
// until (0: no bound).
func (g *Guard) leaseBefore(until, now mono.Time) time.Duration {
	if until == 0 {
		return g.cfg.Lease
	}
	return min(g.cfg.Lease, until.Sub(now))
}

// runOwned runs work under heartbeats (its lease taken at sent, answered
// at now, bounded by until) and says when its lease ends by this process's count (see
// Config.HeartbeatInterval) and, if the Guard cancelled the work's context
// because the lease was lost or ran out, why (ErrStaleFence,
// ErrLeaseExpired); a panic holds the record and continues.
func (g *Guard) runOwned(ctx context.Context, skey string, fence uint64, sent, now, until mono.Time, progress func(), work Work) (value []byte, err error, leaseEnd mono.Time, lost error) {
	r := &ownedRun{g: g, parent: ctx, key: skey, fence: fence, progress: progress, base: sent, until: until}
	if g.beats != nil {
		if r.leaseEnd().Sub(now) <= g.cfg.HeartbeatInterval {
			r.arm() // a slow acquisition: the lease ends before the first heartbeat
		}
		// The heartbeats outlive the caller: if the caller gives up while the
		// work keeps running, the lease must live as long as the work does.
		g.beats.StartAt(&r.tick, r, now)
	}
	defer func() {
		if g.beats != nil {
			g.beats.Stop(&r.tick)
		}
		if c := r.child.Load(); c != nil {
			if cause := context.Cause(c.ctx); errors.Is(cause, store.ErrStaleFence) || errors.Is(cause, ErrLeaseExpired) {
				lost = cause
			}
		}
		r.end()
		leaseEnd = r.leaseEnd()
	}()
	defer g.holdOnPanic(skey, fence)
	value, err = work(r, fence)
	return value, err, 0, nil
}

// ownedRun is one run in flight: its lease is extended by the Guard's
// heartbeat scheduler (one timer for every run) for as long as the work runs
// — not as long as the caller waits: its store calls do not end with the
// caller's context. When the store says the fence is stale, the lease is
// lost: the work's context is cancelled with ErrStaleFence as its cause;
// when no heartbeat reached the store before the lease would end, with
// ErrLeaseExpired (the watch, a timer made at the first heartbeat: a run
// shorter than one heartbeat interval needs none; without heartbeats, made
// when the work first asks for Done or Err, at the acquisition's lease).
//
// ownedRun is also the work's context. It is the caller's context until
// something asks for more: its cancellable child (context.WithCancelCause)
// is made only when the work first asks for Done or the lease is lost; values
// come from the child once it exists (which is how context.Cause finds
// ErrStaleFence) and from the caller's context before — so a run
// whose work never waits on its context costs one allocation, not three.
// Once the run has ended the context reports Canceled, as a context cancelled
// at the end of a call does.
type ownedRun struct {
	tick     ticks.Tick
	g        *Guard
	parent   context.Context
	key      string
	fence    uint64
	progress func()

	child atomic.Pointer[cancelChild] // nil until first needed
	ended atomic.Bool

	// The lease was last taken or extended by a call sent at base+extended
	// (monotonic); watch fires at its end less the margin. No lease goes
	// past until (0: no bound; RunOptions.LeaseDeadline).
	base     mono.Time
	extended atomic.Int64
	watch    atomic.Pointer[time.Timer]
	until    mono.Time
}

// leaseLeft is how long the run's lease lasts by this process's clock, less
// the margin (see Config.HeartbeatInterval); not positive once it ran out.
func (r *ownedRun) leaseLeft() time.Duration { return mono.Until(r.leaseEnd()) }

// leaseEnd is when the run's lease ends by this process's clock, less the
// margin (read from no clock).
func (r *ownedRun) leaseEnd() mono.Time {
	end := r.base.Add(time.Duration(r.extended.Load()) + r.g.cfg.Lease - r.g.leaseMargin())
	if r.until != 0 { // the margin of the bounded lease, in proportion
		end = min(end, r.until.Add(-min(r.g.leaseMargin(), r.until.Sub(r.base)/10)))
	}
	return end
}

// leaseMargin is how long before a lease's end by this process's clock the
// Guard treats it as gone (see Config.HeartbeatInterval).
func (g *Guard) leaseMargin() time.Duration {
	return min(g.cfg.Lease/10, (g.cfg.Lease-g.cfg.HeartbeatInterval)/2)
}

// expire cancels the work if its lease ran out; it is the watch's function.
func (r *ownedRun) expire() {
	if r.leaseLeft() <= 0 && !r.ended.Load() {
		r.cancellable().cancel(ErrLeaseExpired)
	}
}

// arm sets the watch to fire at the end of the lease, or expires the lease
// at once if it ran out.
func (r *ownedRun) arm() {
	left := r.leaseLeft()
	if left <= 0 {
		r.expire()
	}
	if t := r.watch.Load(); t != nil {
		t.Reset(left)
		return
	}
	r.watch.Store(time.AfterFunc(left, r.expire))
}

// cancelChild is the run's cancellable context once made.
type cancelChild struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// cancellable returns the run's cancellable child context, making it on
// first use; a child made after the run ended is cancelled at once.
func (r *ownedRun) cancellable() *cancelChild {
	if c := r.child.Load(); c != nil {
		return c
	}
	ctx, cancel := context.WithCancelCause(r.parent)
	c := &cancelChild{ctx: ctx, cancel: cancel}
	if !r.child.CompareAndSwap(nil, c) {
		cancel(nil)
		return r.child.Load()
	}
	if r.ended.Load() {
		cancel(nil)
	} else if r.g.beats == nil {
		r.arm() // without heartbeats the watch starts when the work first looks
	}
	return c
}

// end cancels the run's context when the run returns.
func (r *ownedRun) end() {
	r.ended.Store(true)
	if t := r.watch.Load(); t != nil {
		t.Stop()
	}
	if c := r.child.Load(); c != nil {
		c.cancel(nil)
	}
}

// Deadline is the caller's; without heartbeats, the end of the lease by
// this process's count (see Config.HeartbeatInterval) if that comes first.
func (r *ownedRun) Deadline() (time.Time, bool) {
	d, ok := r.parent.Deadline()
	if r.g.beats != nil {
		return d, ok
	}
	if end := r.leaseEnd().Wall(); !ok || end.Before(d) {
		return end, true
	}
	return d, true
}

func (r *ownedRun) Done() <-chan struct{} { return r.cancellable().ctx.Done() }

func (r *ownedRun) Err() error {
	c := r.child.Load()
	if c == nil && r.g.beats == nil && !r.ended.Load() {
		c = r.cancellable() // the watch, without heartbeats
	}
	if c != nil {
		return c.ctx.Err()
	}
	if r.ended.Load() {
		return context.Canceled
	}
	return r.parent.Err()
}

func (r *ownedRun) Value(key any) any {
	if key == (fenceKey{}) {
		return r.fence
	}
	if c := r.child.Load(); c != nil || r.ended.Load() {
		return r.cancellable().ctx.Value(key)
	}
	return r.parent.Value(key)
}

// Tick beats once; false ends the heartbeats (the lease is lost).
func (r *ownedRun) Tick() bool {
	g := r.g
	start := g.startTiming()
	if r.watch.Load() == nil {
		r.arm() // the first beat: from now on no hung or failing store keeps the work running past its lease
	}
	now := mono.Now()
	sent := now.Sub(r.base)
	lease := g.leaseBefore(r.until, now)
	if lease < time.Millisecond { // at LeaseDeadline: the lease ends there
		r.expire()
		return true
	}
	// One beat may take at most the time left before the lease would end
	// had this beat been skipped; a hung store call must not delay the next.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.parent), g.cfg.Lease-g.cfg.HeartbeatInterval)
	err := g.cfg.Store.Heartbeat(ctx, r.key, r.fence, lease)
	cancel()
	lost := errors.Is(err, store.ErrStaleFence)
	switch {
	case lost:
		// Before the event: an observer told of the loss finds the work
		// told too.
		r.cancellable().cancel(store.ErrStaleFence)
		r.watch.Load().Stop()
	case err == nil:
		r.extended.Store(int64(sent))
		r.arm()
	default:
		r.expire() // the lease may be gone already by this process's count
	}
	g.observe(Event{Phase: "heartbeat", Key: r.key, Fence: r.fence, Duration: g.since(start), Err: err})
	if lost {
		return false
	}
	if err == nil && r.progress != nil {
		r.progress()
	}
	return true
}

func (g *Guard) holdOnPanic(skey string, fence uint64) {
	if p := recover(); p != nil {
		g.observe(Event{Phase: "settle", Key: skey, Disposition: Hold, Fence: fence, Err: fmt.Errorf("idem: work panicked: %v", p)})
		panic(p)
	}
}

// settle applies disp to the record. A completion or a failure that could
// not reach the store is tried again, with backoff (ctxsleep.RetryPausing),
// as long as the claim lasts: left in flight, the record would be run again
// by the next delivery once the lease ends. The lease lasts until leaseEnd;
// with heartbeats on and while the caller's ctx lasts, a heartbeat between
// the tries extends it a heartbeat interval after the last extension, so a
// store that takes heartbeats but not the settle (a tiered store whose cold
// tier is out of reach or slow) keeps the claim until the settle lands. A
// try that finds the fence stale after an earlier one whose fate is unknown
// asks the store whether that one landed.
func (g *Guard) settle(ctx context.Context, skey string, fence uint64, disp Disposition, value []byte, workErr error, res *Result, leaseEnd, until mono.Time) error {
	// The settle outlives the caller's cancellation. Done is not asked: a
	// context may start watching its parent when first asked (httpidem's).
	sctx := ctx
	if ctx != context.Background() && ctx != context.TODO() {
		sctx = context.WithoutCancel(ctx)
	}
	var err error
	var settled store.State
	switch disp {
	case Complete:
		settled = store.StateCompleted
	case Fail:
		msg := []byte("failed")
		if workErr != nil {
			msg = []byte(workErr.Error())
		}
		res.Failed = true
		res.Value = msg
		value = msg
		settled = store.StateFailed
	}
	try := 0
	longest := time.Second // ctxsleep.Retry's
	if g.beats != nil {
		longest = min(longest, g.cfg.HeartbeatInterval) // a heartbeat between tries keeps the lease
	}
	ctxsleep.RetryPausing(sctx, func() time.Time { return leaseEnd.Wall() }, longest, func() bool {
		start := g.startTiming()
		switch disp {
		case Complete:
			err = g.cfg.Store.Complete(sctx, skey, fence, value, g.cfg.Retention)
		case Fail:
			err = g.cfg.Store.Fail(sctx, skey, fence, value, g.cfg.FailureRetention)
		case Release:
			err = g.cfg.Store.Release(sctx, skey, fence)
		case Hold:
		default:
			err = fmt.Errorf("idem: Classify returned unknown disposition %d", disp)
		}
		if try++; try > 1 && errors.Is(err, store.ErrStaleFence) {
			if rec, gerr := g.cfg.Store.Get(sctx, skey); gerr == nil && rec.Fence == fence && rec.State == settled {
				err = nil // an earlier try landed; its answer was lost
			}
		}
		g.observe(Event{Phase: "settle", Key: skey, Disposition: disp, Fence: fence, Duration: g.since(start), Err: err})
		// Only a completion or failure whose fate is unknown goes again.
		again := settled != 0 && (errors.Is(err, ErrStoreUnavailable) || errors.Is(err, context.DeadlineExceeded))
		if again && g.beats != nil && ctx.Err() == nil && mono.Until(leaseEnd) <= g.cfg.Lease-g.leaseMargin()-g.cfg.HeartbeatInterval {
			leaseEnd = g.extendWhileSettling(sctx, skey, fence, leaseEnd, until)
		}
		return again
	})
	if err != nil {
		return fmt.Errorf("idem: settle (%s) %s: %w", disp, store.DisplayKey(skey), err)
	}
	if g.cache != nil && (disp == Complete || disp == Fail) {
		st := store.StateCompleted
		if disp == Fail {
			st = store.StateFailed
		}
		now := g.cfg.Clock.Now()
		ret := g.cfg.Retention
		if disp == Fail {
			ret = g.cfg.FailureRetention
		}
		g.cache.put(store.Record{Key: skey, State: st, Fence: fence, Fingerprint: res.Record.Fingerprint, Result: res.Value, ExpiresAt: now.Add(ret)}, now)
	}
	return nil
}

// extendWhileSettling heartbeats the claim of a settle that goes again and
// returns the lease's end by this process's count: moved on if the
// heartbeat landed, leaseEnd otherwise. A stale fence is not the end of the
// settle: an earlier try may have landed, and the next try asks.
func (g *Guard) extendWhileSettling(ctx context.Context, skey string, fence uint64, leaseEnd, until mono.Time) mono.Time {
	start := g.startTiming()
	sent := mono.Now()
	lease := g.leaseBefore(until, sent)
	if lease < time.Millisecond {
		return leaseEnd // at the run's LeaseDeadline
	}
	hctx, cancel := context.WithTimeout(ctx, g.cfg.Lease-g.cfg.HeartbeatInterval)
	err := g.cfg.Store.Heartbeat(hctx, skey, fence, lease)
	cancel()
	g.observe(Event{Phase: "heartbeat", Key: skey, Fence: fence, Duration: g.since(start), Err: err})
	if err != nil {
		return leaseEnd
	}
	return sent.Add(lease - g.leaseMargin())
}

func (g *Guard) observe(e Event) {
	if g.cfg.Observer != nil {
		g.cfg.Observer(e)
	}
}

// startTiming reads the clock for an Event's Duration — only when an
// Observer will see it.
func (g *Guard) startTiming() time.Time {
	if g.cfg.Observer == nil {
		return time.Time{}
	}
	return g.cfg.Clock.Now()
}

func (g *Guard) since(t time.Time) time.Duration {
	if g.cfg.Observer == nil {
		return 0
	}
	return g.cfg.Clock.Now().Sub(t)
}

// Forget removes key from the in-process cache (if any) and the store.
func (g *Guard) Forget(ctx context.Context, key Key) error {
	skey := key.Storage(g.cfg.CompactKeys)
	if g.cache != nil {
		g.cache.remove(skey)
	}
	return g.cfg.Store.Delete(ctx, skey)
}
