package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// The work's context ends with the run, whether or not the work ever looked
// at it: a goroutine the work left behind sees Canceled, as with a context
// cancelled at the end of a call.
func TestWorkContextEndsWithTheRun(t *testing.T) {
	for _, touch := range []bool{false, true} {
		t.Run("touched="+strconv.FormatBool(touch), func(t *testing.T) {
			g, _ := newGuard(t, idem.Config{})
			var kept context.Context
			_, err := g.Run(context.Background(), key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
				kept = ctx
				if touch {
					_ = ctx.Done()
				}
				if ctx.Err() != nil {
					t.Errorf("while the work runs: Err = %v", ctx.Err())
				}
				if f, ok := idem.FenceFrom(ctx); !ok || f != fence {
					t.Errorf("FenceFrom = %d, %v; want %d", f, ok, fence)
				}
				return nil, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-kept.Done():
			default:
				t.Fatal("the work's context is not done after the run returned")
			}
			if !errors.Is(kept.Err(), context.Canceled) || !errors.Is(context.Cause(kept), context.Canceled) {
				t.Fatalf("after the run: Err = %v, Cause = %v; want Canceled", kept.Err(), context.Cause(kept))
			}
			derived, cancel := context.WithCancel(kept)
			defer cancel()
			<-derived.Done() // a context derived after the end is done at once
		})
	}
}

// A lease lost while the work never waited on its context is still seen by
// Err, by context.Cause (ErrStaleFence) and by a context the work derived
// before the loss.
func TestLostLeaseSeenWithoutWaitingOnDone(t *testing.T) {
	stale := make(chan struct{}, 1)
	g, s := newGuard(t, idem.Config{
		Lease: 200 * time.Millisecond, HeartbeatInterval: 20 * time.Millisecond,
		Observer: func(e idem.Event) {
			if e.Phase == "heartbeat" && errors.Is(e.Err, store.ErrStaleFence) {
				select {
				case stale <- struct{}{}:
				default:
				}
			}
		},
	})
	ctx, cancelParent := context.WithCancel(context.Background())
	defer cancelParent()
	_, err := g.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
		derived, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		if err := s.Delete(ctx, g.StorageKey(key)); err != nil {
			return nil, err
		}
		select {
		case <-stale:
		case <-time.After(10 * time.Second):
			t.Fatal("no heartbeat found the fence stale")
		}
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Errorf("Err = %v, want Canceled", ctx.Err())
		}
		if !errors.Is(context.Cause(ctx), store.ErrStaleFence) {
			t.Errorf("Cause = %v, want ErrStaleFence", context.Cause(ctx))
		}
		select {
		case <-derived.Done():
			if !errors.Is(context.Cause(derived), store.ErrStaleFence) {
				t.Errorf("derived Cause = %v, want ErrStaleFence", context.Cause(derived))
			}
		case <-time.After(10 * time.Second):
			t.Error("a context derived from the work's is not cancelled by the lost lease")
		}
		return nil, ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want the work's Canceled", err)
	}
}

// The caller's cancellation reaches the work's context before and after the
// work first waits on it.
func TestCallerCancelReachesTheWork(t *testing.T) {
	for _, waitFirst := range []bool{false, true} {
		t.Run("waitFirst="+strconv.FormatBool(waitFirst), func(t *testing.T) {
			g, _ := newGuard(t, idem.Config{})
			ctx, cancel := context.WithCancelCause(context.Background())
			cause := errors.New("caller gone")
			_, err := g.Run(ctx, key, nil, func(wctx context.Context, fence uint64) ([]byte, error) {
				var done <-chan struct{}
				if waitFirst {
					done = wctx.Done()
				}
				cancel(cause)
				if done == nil {
					if !errors.Is(wctx.Err(), context.Canceled) {
						t.Errorf("Err before Done = %v", wctx.Err())
					}
					done = wctx.Done()
				}
				<-done
				if !errors.Is(context.Cause(wctx), cause) {
					t.Errorf("Cause = %v, want the caller's", context.Cause(wctx))
				}
				return nil, wctx.Err()
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Run = %v", err)
			}
		})
	}
}

// Guard.Run allocates at most one value more than the store calls it makes
// (the run in flight, which is also the work's context) when the work does
// not wait on its context: no timer, goroutine or cancellable context per run.
func TestGuardRunAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("allocation counts differ under the race detector")
	}
	const runs = 2000
	result := []byte(`{"ok":true}`)
	keys := make([]string, 2*runs+2)
	for i := range keys {
		keys[i] = idem.Key{Scope: "alloc", ID: strconv.Itoa(i)}.Storage(false)
	}
	ctx := context.Background()
	s := memstore.New(memstore.Config{SweepInterval: -1})
	defer s.Close()
	i := 0
	raw := testing.AllocsPerRun(runs, func() {
		k := keys[i]
		i++
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: 30 * time.Second, Retention: time.Hour})
		if err != nil || a.Outcome != store.Acquired {
			t.Fatal(a.Outcome, err)
		}
		if err := s.Complete(ctx, k, a.Fence, result, time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	g, err := idem.NewGuard(idem.Config{Store: s, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	work := func(context.Context, uint64) ([]byte, error) { return result, nil }
	guarded := testing.AllocsPerRun(runs, func() {
		// Scope "alloc" and the ID give the same storage key as above's keys[i].
		res, err := g.Run(ctx, idem.Key{Scope: "alloc", ID: strconv.Itoa(i)}, nil, work)
		i++
		if err != nil || res.Outcome != store.Acquired {
			t.Fatal(res.Outcome, err)
		}
	})
	// The guarded loop builds its key (strconv and Storage: two allocations)
	// where the raw loop took a prepared one.
	if extra := guarded - raw - 2; extra > 1.2 {
		t.Fatalf("Guard.Run allocates %.1f times per run against %.1f for the raw store calls: %.1f more than the one it needs", guarded, raw, extra)
	}
}

// Applying a disposition costs no allocation: the Guard reads the one the
// work decided (WithDisposition, how adapters such as httpidem settle every
// request) and the default policy classifies an error without allocating.
func TestClassifyingAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("allocation counts differ under the race detector")
	}
	decided := idem.WithDisposition(idem.Complete, errors.New("response stored"))
	g, _ := newGuard(t, idem.Config{})
	ctx := context.Background()
	i := 0
	run := func(err error) func() {
		return func() {
			i++
			if _, e := g.Run(ctx, idem.Key{Scope: "classify", ID: strconv.Itoa(i)}, nil, func(context.Context, uint64) ([]byte, error) {
				return []byte("ok"), err
			}); e != nil && e != err {
				t.Fatal(e)
			}
		}
	}
	plain, withDisposition := testing.AllocsPerRun(500, run(nil)), testing.AllocsPerRun(500, run(decided))
	if withDisposition > plain {
		t.Errorf("a run whose work decided its disposition allocates %.0f, one returning nil %.0f", withDisposition, plain)
	}
	for _, err := range []error{idem.Permanent(errors.New("no")), idem.Ambiguous(errors.New("maybe")), errors.New("transient")} {
		wrapped := fmt.Errorf("wrapped: %w", err)
		if n := testing.AllocsPerRun(100, func() { idem.DefaultClassify(wrapped) }); n != 0 {
			t.Errorf("DefaultClassify(%v) allocates %.0f", wrapped, n)
		}
	}
}
