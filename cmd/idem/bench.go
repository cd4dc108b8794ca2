package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/cputime"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/storeurl"
)

type benchOpts struct {
	store       string
	concurrency int
	duration    time.Duration
	keys        int
	mode        string
	asJSON      bool
	quiet       bool
	retention   time.Duration
}

func newBenchCmd() *cobra.Command {
	var o benchOpts
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure acquire+complete lifecycles and replays per second on a store",
		Long: `Runs N goroutines against the store. The lifecycle phase acquires a fresh key
and completes it (two transitions, two round trips); the replay phase acquires
keys that are already completed (one round trip, the duplicate path). Prints a
live progress line, then ops/s and p50/p99 latency per phase; with --json the
last line is one JSON object.`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().StringVar(&o.store, "store", "sqlite:idem-bench.db", "store URL")
	cmd.Flags().IntVar(&o.concurrency, "concurrency", 32, "concurrent workers")
	cmd.Flags().DurationVar(&o.duration, "duration", 10*time.Second, "how long each phase runs")
	cmd.Flags().IntVar(&o.keys, "keys", 10000, "distinct completed keys the replay phase cycles through")
	cmd.Flags().StringVar(&o.mode, "mode", "both", "phases to run: lifecycle, replay or both")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "end with one JSON object on the last line")
	cmd.Flags().BoolVar(&o.quiet, "quiet", false, "no progress line")
	cmd.Flags().DurationVar(&o.retention, "retention", 5*time.Minute, "how long the store keeps the records the run writes (scope idem-bench): Redis forgets them then, SQL stores at their next sweep; longer than both phases")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if o.concurrency < 1 || o.keys < 1 || o.duration <= 0 {
			return fmt.Errorf("--concurrency, --keys and --duration must be positive")
		}
		if o.mode != "both" && o.mode != "lifecycle" && o.mode != "replay" {
			return fmt.Errorf("--mode is %q, want lifecycle, replay or both", o.mode)
		}
		if o.retention <= 2*o.duration {
			return fmt.Errorf("--retention %v must outlast both phases (more than twice --duration, %v): the replay phase replays records the run wrote", o.retention, 2*o.duration)
		}
		// The pool fits the workers unless the URL sizes it.
		s, err := storeurl.Open(cmd.Context(), o.store, &storeurl.Options{Concurrency: o.concurrency})
		if err != nil {
			return err
		}
		defer s.Close()
		if p, ok := s.(interface{ PoolSize() int32 }); ok {
			fmt.Fprintf(cmd.ErrOrStderr(), "idem bench: %d workers on a pool of %d connections\n", o.concurrency, p.PoolSize())
		}
		return runBench(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), s, o)
	}
	return cmd
}

// phaseResult is one phase's figures.
type phaseResult struct {
	FirstError string  `json:"first_error,omitempty"`
	Ops        int64   `json:"ops"`
	Errors     int64   `json:"errors"`
	Seconds    float64 `json:"seconds"`
	OpsPerSec  float64 `json:"ops_per_sec"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	// ClientCPUusPerOp is the CPU time this process (the workers, the
	// store's client, the Go runtime) spent per operation during the phase,
	// user and system, in µs: with the server's own CPU per operation it
	// says what an operation costs where the cores are the limit. Left out
	// where the platform's CPU time is not read.
	ClientCPUusPerOp float64 `json:"client_cpu_us_per_op,omitempty"`
}

type benchReport struct {
	Store       string       `json:"store"`
	Concurrency int          `json:"concurrency"`
	Lifecycle   *phaseResult `json:"lifecycle,omitempty"`
	Replay      *phaseResult `json:"replay,omitempty"`
	// The headline figures: the lifecycle phase's (or the replay's when
	// only it ran).
	OpsPerSec float64 `json:"ops_per_sec"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	// ClientCPUusPerOp: see phaseResult.
	ClientCPUusPerOp float64 `json:"client_cpu_us_per_op,omitempty"`
	// CallsPerSharedTrip: of the calls that shared a round trip with others
	// (a coalescing store), how many each trip carried on average.
	CallsPerSharedTrip float64 `json:"calls_per_shared_trip,omitempty"`
}

func runBench(ctx context.Context, out, progress io.Writer, s store.Store, o benchOpts) error {
	var runID [6]byte
	_, _ = rand.Read(runID[:])
	// Keys are scoped "idem-bench", with a run id so runs never collide.
	prefix := idem.Key{Scope: "idem-bench", ID: hex.EncodeToString(runID[:]) + "-"}.Storage(false)
	rep := benchReport{Store: o.store, Concurrency: o.concurrency}
	req := func(key string) store.AcquireRequest {
		return store.AcquireRequest{Key: key, Fingerprint: "bench", Lease: time.Minute, Retention: o.retention}
	}
	result := []byte(`{"status":"ok"}`)

	var seq atomic.Uint64
	lifecycle := func(ctx context.Context, buf []byte) ([]byte, error) {
		buf = strconv.AppendUint(append(buf[:0], prefix...), seq.Add(1), 10)
		key := string(buf)
		a, err := s.Acquire(ctx, req(key))
		if err != nil {
			return buf, err
		}
		if a.Outcome != store.Acquired {
			return buf, fmt.Errorf("fresh key %s: %v", key, a.Outcome)
		}
		return buf, s.Complete(ctx, key, a.Fence, result, o.retention)
	}
	if o.mode != "replay" {
		r, err := runPhase(ctx, progress, "lifecycle", o, lifecycle)
		if err != nil {
			return err
		}
		rep.Lifecycle = r
		printPhase(out, "lifecycle (acquire+complete) ", r, o.concurrency)
	}
	if o.mode != "lifecycle" {
		// The replay keys: completed once, then acquired again and again.
		names := make([]string, o.keys)
		for i := range names {
			names[i] = prefix + "replay-" + strconv.Itoa(i)
		}
		if err := parallel(ctx, o.concurrency, len(names), func(ctx context.Context, i int) error {
			a, err := s.Acquire(ctx, req(names[i]))
			if err != nil {
				return err
			}
			return s.Complete(ctx, names[i], a.Fence, result, o.retention)
		}); err != nil {
			return fmt.Errorf("preparing replay keys: %w", err)
		}
		var next atomic.Uint64
		replay := func(ctx context.Context, buf []byte) ([]byte, error) {
			a, err := s.Acquire(ctx, req(names[next.Add(1)%uint64(len(names))]))
			if err == nil && a.Outcome != store.Replayed {
				err = fmt.Errorf("replay: %v", a.Outcome)
			}
			return buf, err
		}
		r, err := runPhase(ctx, progress, "replay", o, replay)
		if err != nil {
			return err
		}
		rep.Replay = r
		printPhase(out, "replay (acquire of a done key)", r, o.concurrency)
	}
	head := rep.Lifecycle
	if head == nil {
		head = rep.Replay
	}
	rep.OpsPerSec, rep.P50us, rep.P99us, rep.ClientCPUusPerOp = head.OpsPerSec, head.P50us, head.P99us, head.ClientCPUusPerOp
	if c, ok := s.(interface{ CoalesceStats() (int64, int64) }); ok {
		if trips, calls := c.CoalesceStats(); trips > 0 {
			rep.CallsPerSharedTrip = float64(calls) / float64(trips)
			fmt.Fprintf(out, "coalesced: %d calls shared %d round trips (%.1f per trip)\n", calls, trips, rep.CallsPerSharedTrip)
		}
	}
	if o.asJSON {
		return json.NewEncoder(out).Encode(rep)
	}
	return nil
}

// printPhase prints a phase's line (name padded to the same width) and its
// first error, if any.
func printPhase(out io.Writer, name string, r *phaseResult, workers int) {
	fmt.Fprintf(out, "%s %10.0f ops/s  p50 %7.0fµs  p99 %7.0fµs  (%d ops, %d errors, %d workers", name, r.OpsPerSec, r.P50us, r.P99us, r.Ops, r.Errors, workers)
	if r.ClientCPUusPerOp > 0 {
		fmt.Fprintf(out, "; this process's CPU %.1fµs/op", r.ClientCPUusPerOp)
	}
	fmt.Fprintln(out, ")")
	if r.FirstError != "" {
		fmt.Fprintf(out, "  first error: %s\n", r.FirstError)
	}
}

func parallel(ctx context.Context, workers, n int, fn func(ctx context.Context, i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// runPhase runs op from o.concurrency goroutines for o.duration. An op error
// is counted; if every op fails, the phase fails with the first error.
func runPhase(ctx context.Context, progress io.Writer, name string, o benchOpts, op func(context.Context, []byte) ([]byte, error)) (*phaseResult, error) {
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var ops, errCount atomic.Int64
	var firstErr atomic.Value
	hists := make([]histogram, o.concurrency)
	var wg sync.WaitGroup
	cpu0, cpuOK := cputime.Process()
	start := time.Now()
	for w := range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := &hists[w]
			buf := make([]byte, 0, 64)
			for ctx.Err() == nil {
				t0 := time.Now()
				var err error
				buf, err = op(ctx, buf)
				if err != nil {
					if ctx.Err() != nil {
						return // the phase ended mid-operation
					}
					errCount.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				h.record(time.Since(t0))
				ops.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	last, lastT := int64(0), start
loop:
	for {
		select {
		case <-done:
			break loop
		case now := <-tick.C:
			if !o.quiet {
				n := ops.Load()
				fmt.Fprintf(progress, "\r%-9s %5.1fs  %10d ops  %9.0f ops/s  %d errors   ", name, now.Sub(start).Seconds(),
					n, float64(n-last)/now.Sub(lastT).Seconds(), errCount.Load())
				last, lastT = n, now
			}
		}
	}
	elapsed := time.Since(start)
	cpu1, _ := cputime.Process()
	if !o.quiet {
		fmt.Fprint(progress, "\r\033[K")
	}
	var all histogram
	for i := range hists {
		all.merge(&hists[i])
	}
	n := ops.Load()
	if n == 0 {
		if e, ok := firstErr.Load().(error); ok {
			return nil, fmt.Errorf("%s: every operation failed: %w", name, e)
		}
		return nil, fmt.Errorf("%s: no operation completed in %v", name, o.duration)
	}
	var first string
	if e, ok := firstErr.Load().(error); ok {
		first = e.Error()
	}
	r := &phaseResult{
		FirstError: first,
		Ops:        n, Errors: errCount.Load(), Seconds: elapsed.Seconds(),
		OpsPerSec: float64(n) / elapsed.Seconds(),
		P50us:     all.quantile(0.50).Seconds() * 1e6,
		P99us:     all.quantile(0.99).Seconds() * 1e6,
	}
	if cpuOK {
		r.ClientCPUusPerOp = (cpu1 - cpu0).Seconds() * 1e6 / float64(n)
	}
	return r, nil
}

// histogram is a log-linear latency histogram: 16 sub-buckets per power of
// two of nanoseconds (about 6% resolution), no allocation per sample.
type histogram struct {
	counts [64 * 16]int64
	total  int64
}

func bucketOf(ns uint64) int {
	if ns < 16 {
		return int(ns)
	}
	exp := bits.Len64(ns) - 5 // keep 4 bits below the leading one
	return (exp+1)*16 + int((ns>>uint(exp))&15)
}

func bucketValue(b int) time.Duration {
	if b < 16 {
		return time.Duration(b)
	}
	exp := b/16 - 1
	return time.Duration((uint64(16) | uint64(b%16)) << uint(exp))
}

func (h *histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	h.total++
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
}

func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := int64(q*float64(h.total-1)) + 1
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return bucketValue(i)
		}
	}
	return bucketValue(len(h.counts) - 1)
}
