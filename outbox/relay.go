package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/ctxsleep"
	"github.com/idemgo/idem/internal/testsignal"
)

// Result is a sender's verdict on one attempt.
type Result struct {
	// Status is Sent or Acked on success (Acked when the destination's
	// answer is itself the receipt), Pending to retry later, Dead to stop.
	Status Status
	// Err explains Pending and Dead (recorded as last_error); on success it
	// may say why, e.g. that the receiver answered "duplicate".
	Err error
}

// Sender delivers one message, with m.Key in the protocol's dedup field. A
// receiver's "duplicate" answer to a retry means the first copy arrived:
// report success, not failure.
type Sender interface {
	Send(ctx context.Context, m *Message) Result
}

// SenderFunc adapts a function to Sender.
type SenderFunc func(ctx context.Context, m *Message) Result

// Send calls f.
func (f SenderFunc) Send(ctx context.Context, m *Message) Result { return f(ctx, m) }

// Router chooses the sender by the destination's scheme ("http", "nats", …).
type Router map[string]Sender

// Send implements Sender. An unknown scheme is Dead.
func (r Router) Send(ctx context.Context, m *Message) Result {
	scheme, _, _ := strings.Cut(m.Destination, ":")
	s, ok := r[strings.ToLower(scheme)]
	if !ok {
		return Result{Status: Dead, Err: fmt.Errorf("no sender for the %q scheme", scheme)}
	}
	return s.Send(ctx, m)
}

// RelayConfig configures a Relay. Store and Sender are required.
type RelayConfig struct {
	Store  *Store
	Sender Sender
	// Batch is how many due rows one claim takes. Defaults to 100.
	Batch int
	// Concurrency is how many sends of a batch run at once. Defaults to 32.
	Concurrency int
	// Lease is how long a claim lives without renewal; a relay killed
	// mid-batch leaves its rows to be claimed again after it. Defaults to
	// 1m. While a batch is out the relay renews its claim every Lease/4
	// until every outcome is recorded, so a slow send, a sender that ignores
	// its timeout, or a slow database while recording keeps its rows; only a
	// relay that stops renewing for 3/4 of a lease (killed, or frozen) lets a
	// second relay re-claim them. A send starts only while the claim, as
	// last renewed, has time left for it and for recording the outcome
	// (SendTimeout + Lease/4); rows it could not start in time are handed
	// back at the end of the batch.
	Lease time.Duration
	// SendTimeout bounds one send. Defaults to 30s; at most 3/4 of Lease
	// (the rest is kept for recording outcomes).
	SendTimeout time.Duration
	// PollInterval is the longest wait for new rows when idle (PostgreSQL
	// wakes the relay at once through LISTEN/NOTIFY). Defaults to 1s.
	PollInterval time.Duration
	// BackoffMin and BackoffMax bound the retry delay: full jitter, uniform
	// in [0, min(max, min·2^tries)]. Default to 1s and 5m.
	BackoffMin, BackoffMax time.Duration
	// MaxTries makes a message dead after this many failed attempts.
	// Defaults to 10.
	MaxTries int
	// DeadRowsReleaseOrderingKeys lets this relay send the rows behind a
	// dead row of their ordering key. By default a dead row holds them
	// back — ordering is what the key asked for — until an operator
	// retries it (Store.Retry) or skips it (Store.Skip).
	DeadRowsReleaseOrderingKeys bool
	// TracerProvider, if set, traces every send: a span "send
	// <destination>" (OpenTelemetry's messaging conventions), the child of
	// the span that enqueued the row, if one did, and linked to it; its
	// context is injected into what is sent (traceparent, tracestate), so
	// the consumer's span joins the trace. Without it, the enqueuing
	// span's context, if any, is injected as it is.
	TracerProvider trace.TracerProvider
	// OnResult, if set, hears every attempt (for logs and metrics). It is
	// called from the sending goroutines: it must be safe for concurrent use.
	OnResult func(m *Message, tries int, r Result)
}

// Relay claims due rows, sends them and records the outcomes.
type Relay struct {
	cfg     RelayConfig
	w       idem.Worker
	signals relaySignals
}

// relaySignals tell tests what the relay does (inert unless a test arms
// them).
type relaySignals struct {
	// Idle: nothing was due; the relay waits for a notification or the
	// poll interval.
	Idle testsignal.Signal[struct{}]
}

// NewRelay validates cfg and returns a stopped relay.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if cfg.Store == nil || cfg.Sender == nil {
		return nil, errors.New("idem/outbox: RelayConfig.Store and RelayConfig.Sender are required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 100
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.MaxTries <= 0 {
		cfg.MaxTries = 10
	}
	def(&cfg.Lease, time.Minute)
	def(&cfg.SendTimeout, 30*time.Second)
	def(&cfg.PollInterval, time.Second)
	def(&cfg.BackoffMin, time.Second)
	def(&cfg.BackoffMax, 5*time.Minute)
	if cfg.SendTimeout > cfg.Lease-recordMargin(cfg.Lease) {
		return nil, fmt.Errorf("idem/outbox: RelayConfig.SendTimeout %v must be at most 3/4 of Lease %v (the rest is kept for recording outcomes)", cfg.SendTimeout, cfg.Lease)
	}
	return &Relay{cfg: cfg}, nil
}

// Backoff returns the delay before the next attempt after tries failures.
func (r *Relay) Backoff(tries int) time.Duration {
	d := r.cfg.BackoffMin
	for i := 1; i < tries && d < r.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.BackoffMax)
	return time.Duration(mrand.Int64N(int64(d) + 1))
}

func newToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// recordMargin is the part of a claim's lease kept for recording outcomes
// after the last send.
func recordMargin(lease time.Duration) time.Duration { return lease / 4 }

// RunOnce claims one batch, sends it and records every outcome. It returns
// how many rows it claimed. In-flight sends finish even if ctx ends. While
// the batch is out, the relay renews its claim every Lease/4, until every
// outcome is recorded: a send that outlasts its SendTimeout (a sender that
// ignores its context) keeps its row. A send starts only if it can end
// (SendTimeout) with the claim's margin for recording left, counted from
// the last renewal that succeeded; the rows not started are handed back
// unsent, due at once. A recording that fails is tried again with backoff
// while the claim lasts; past it, the row is due again when its claim
// expires (sent again, with the same key).
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	token := newToken()
	// The claim ends Lease after the store's clock read it, which is after
	// this instant: measuring from here is conservative, whatever the skew.
	claimed := time.Now()
	batch, err := r.cfg.Store.claim(ctx, token, r.cfg.Lease, r.cfg.Batch, r.cfg.DeadRowsReleaseOrderingKeys)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	ids := make([]int64, len(batch))
	for i, c := range batch {
		ids[i] = c.ID
	}
	var claimEnd atomic.Int64 // unix ns; the claim lives at least until then
	claimEnd.Store(claimed.Add(r.cfg.Lease).UnixNano())
	stopRenewing := r.renew(context.WithoutCancel(ctx), token, ids, &claimEnd)
	defer stopRenewing()
	lastStart := func() time.Time {
		return time.Unix(0, claimEnd.Load()).Add(-recordMargin(r.cfg.Lease) - r.cfg.SendTimeout)
	}
	bg := context.WithoutCancel(ctx)
	results := make([]Result, len(batch))
	sem := make(chan struct{}, r.cfg.Concurrency)
	var wg sync.WaitGroup
	var unsent []int64
	for i := range batch {
		sem <- struct{}{}
		if time.Now().After(lastStart()) {
			<-sem
			for _, c := range batch[i:] {
				unsent = append(unsent, c.ID)
			}
			break
		}
		wg.Add(1)
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			sctx, cancel := context.WithTimeout(bg, r.cfg.SendTimeout)
			defer cancel()
			results[i] = r.traced(sctx, &batch[i])
			if r.cfg.OnResult != nil {
				r.cfg.OnResult(&batch[i].Message, batch[i].Tries+1, results[i])
			}
		}(i)
	}
	wg.Wait()
	var sent, acked []int64
	var errs []error
	// Each recording is tried again while it fails and the claim lasts: a
	// row left claimed is sent again once the claim runs out.
	record := func(fn func() error) error { return recordWhileClaimed(&claimEnd, fn) }
	if len(unsent) > 0 {
		errs = append(errs, record(func() error { return r.cfg.Store.unclaim(bg, token, unsent) }))
	}
	for i, res := range results[:len(batch)-len(unsent)] {
		switch res.Status {
		case Sent:
			sent = append(sent, batch[i].ID)
		case Acked:
			acked = append(acked, batch[i].ID)
		default:
			tries := batch[i].Tries + 1
			dead := res.Status == Dead || tries >= r.cfg.MaxTries
			cause := "unknown failure"
			if res.Err != nil {
				cause = res.Err.Error()
			}
			backoff := r.Backoff(tries)
			if err := record(func() error { return r.cfg.Store.markFailed(bg, token, batch[i].ID, cause, backoff, dead) }); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, record(func() error { return r.cfg.Store.markSent(bg, token, Sent, sent) }),
		record(func() error { return r.cfg.Store.markSent(bg, token, Acked, acked) }))
	return len(batch), errors.Join(errs...)
}

// recordWhileClaimed runs fn, a recording of outcomes, again with backoff
// (ctxsleep.Retry) while it fails and the claim lasts (claimEnd, unix ns).
// A recording is safe to repeat: it changes only rows the claim still
// holds, and a recording that landed released them.
func recordWhileClaimed(claimEnd *atomic.Int64, fn func() error) error {
	var err error
	ctxsleep.Retry(context.Background(), func() time.Time { return time.Unix(0, claimEnd.Load()) }, func() bool {
		err = fn()
		return err != nil
	})
	return err
}

// renew extends the claim of the rows of ids it still holds every Lease/4
// until the returned function is called (which waits for a renewal in
// flight), so rows whose outcome is still being recorded stay its own. It
// moves claimEnd forward after each renewal that found every row of the
// batch still claimed; once one found fewer — another relay took a row
// after this one stalled past its lease, or outcomes are being recorded —
// claimEnd stays where it is, so no further send starts. A renewal that
// failed changes nothing.
func (r *Relay) renew(ctx context.Context, token string, ids []int64, claimEnd *atomic.Int64) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.cfg.Lease / 4)
		defer t.Stop()
		whole := true // every row of the batch still this claim's
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			start := time.Now()
			n, err := r.cfg.Store.extend(ctx, token, r.cfg.Lease, ids)
			if err != nil {
				continue
			}
			if n < int64(len(ids)) {
				whole = false
			}
			if whole {
				claimEnd.Store(start.Add(r.cfg.Lease).UnixNano())
			}
		}
	}()
	return func() { close(quit); <-done }
}

// traced sends c within its span (see RelayConfig.TracerProvider), its
// trace context in the message's headers.
func (r *Relay) traced(ctx context.Context, c *claimed) Result {
	if r.cfg.TracerProvider == nil && c.trace == "" {
		return r.send(ctx, &c.Message)
	}
	enqueued := extractTraceContext(ctx, c.trace)
	m := c.Message
	m.Headers = maps.Clone(m.Headers)
	if m.Headers == nil {
		m.Headers = map[string]string{}
	}
	if r.cfg.TracerProvider == nil {
		injectTraceContext(enqueued, m.Headers)
		return r.send(ctx, &m)
	}
	ctx, span := startSendSpan(enqueued, r.cfg.TracerProvider, c)
	injectTraceContext(ctx, m.Headers)
	res := r.send(ctx, &m)
	endSendSpan(span, res)
	return res
}

// send runs the sender, turning a panic into a retry.
func (r *Relay) send(ctx context.Context, m *Message) (res Result) {
	defer func() {
		if p := recover(); p != nil {
			res = Result{Status: Pending, Err: fmt.Errorf("sender panicked: %v", p)}
		}
	}()
	res = r.cfg.Sender.Send(ctx, m)
	if res.Status == "" {
		res.Status = Pending
	}
	return res
}

// Start runs the relay until Stop or ctx ends: it claims batches while rows
// are due and waits for new ones (LISTEN/NOTIFY on PostgreSQL, polling
// elsewhere). Errors (the database unreachable, restarting) are retried
// after a pause of 50 ms doubling up to PollInterval, back to 50 ms once a
// look succeeds, so a relay goes on within moments of the database's
// return however long its poll interval; onError hears them.
func (r *Relay) Start(ctx context.Context, onError func(error)) error {
	return r.w.Start(ctx, func(ctx context.Context) {
		var pause time.Duration
		listen := true // before the next look
		for ctx.Err() == nil {
			if listen {
				// A row committed after this notifies the next wait. No
				// round trip while the connection listens; one to listen
				// again once a wait or an error lost it.
				r.cfg.Store.listenEarly(ctx)
			}
			n, err := r.RunOnce(ctx)
			if err != nil && onError != nil && ctx.Err() == nil {
				onError(err)
			}
			if err != nil {
				pause = min(max(2*pause, errorPauseMin), r.cfg.PollInterval)
				_ = ctxsleep.Sleep(ctx, pause)
				listen = true
				continue
			}
			pause, listen = 0, false
			if n == r.cfg.Batch {
				continue // more may be due
			}
			r.signals.Idle.Signal(struct{}{})
			r.cfg.Store.wait(ctx, r.cfg.PollInterval)
			listen = true
		}
	})
}

// errorPauseMin is the first pause of a relay after an error.
const errorPauseMin = 50 * time.Millisecond

// Stop ends the relay after the batch in flight is sent and recorded, or
// when ctx ends.
func (r *Relay) Stop(ctx context.Context) error { return r.w.Stop(ctx) }
