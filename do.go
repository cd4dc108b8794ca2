package idem

import (
	"context"
	"encoding/json"
	"fmt"
)

type fenceKey struct{}

// FenceFrom returns the fencing token of the guarded call running in ctx
// (the context Guard.Run hands its work, and Do its fn), so a business write
// can be conditioned on it.
func FenceFrom(ctx context.Context) (uint64, bool) {
	f, ok := ctx.Value(fenceKey{}).(uint64)
	return f, ok
}

// Do runs fn at most once for key and returns its result, JSON-encoded in the
// store and decoded for every duplicate:
//
//	booking, err := idem.Do(ctx, guard, key, func(ctx context.Context) (Booking, error) { … })
//
// A duplicate of a completed call returns the stored result without running
// fn. The errors are ErrInProgress (another owner is running it: retry
// later), ErrFingerprintMismatch, ErrPoisoned, a *ReplayedFailure (the first
// run failed definitely), fn's own error, or a store failure (fn did not run).
func Do[T any](ctx context.Context, g *Guard, key Key, fn func(context.Context) (T, error)) (T, error) {
	return DoWith(ctx, g, key, nil, fn)
}

// DoWith is Do with per-call options (a request fingerprint).
func DoWith[T any](ctx context.Context, g *Guard, key Key, opts *RunOptions, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	var out T
	res, err := g.Run(ctx, key, opts, func(ctx context.Context, fence uint64) ([]byte, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		out = v
		b, err := json.Marshal(v)
		if err != nil {
			return nil, Permanent(fmt.Errorf("idem: encode result: %w", err))
		}
		return b, nil
	})
	if err != nil {
		return zero, err
	}
	switch res.Outcome {
	case Acquired, TakenOver:
		return out, nil
	case Replayed:
		if res.Failed {
			return zero, &ReplayedFailure{Message: string(res.Value)}
		}
		if err := json.Unmarshal(res.Value, &out); err != nil {
			return zero, fmt.Errorf("idem: decode stored result of %s: %w", key, err)
		}
		return out, nil
	case InProgress:
		return zero, ErrInProgress
	case Mismatch:
		return zero, ErrFingerprintMismatch
	case Poisoned:
		return zero, ErrPoisoned
	}
	return zero, fmt.Errorf("idem: unexpected outcome %v", res.Outcome)
}
