package idem

import (
	"context"
	"errors"
)

// Disposition is what the guard does with a record after the work returns.
type Disposition uint8

// The dispositions, one per kind of outcome of the work.
const (
	// Complete: success; store the result and replay it to duplicates.
	Complete Disposition = 1
	// Fail: a definite failure; store it and replay it to duplicates.
	Fail Disposition = 2
	// Release: a transient failure; give the lease back so the next
	// delivery runs the work again.
	Release Disposition = 3
	// Hold: ambiguous — the effect may have happened (a timeout, a panic);
	// leave the lease to expire so nobody re-runs the work before then.
	Hold Disposition = 4
)

func (d Disposition) String() string {
	switch d {
	case Complete:
		return "complete"
	case Fail:
		return "fail"
	case Release:
		return "release"
	case Hold:
		return "hold"
	}
	return "disposition(?)"
}

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

type ambiguousError struct{ err error }

func (e ambiguousError) Error() string { return e.err.Error() }
func (e ambiguousError) Unwrap() error { return e.err }

// Permanent marks err as a definite business failure: the default policy
// stores it (its message) and replays it to duplicates instead of running the
// work again.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// Ambiguous marks err as an outcome where the side effect may have happened
// (for example a timeout after the request was sent): the default policy holds
// the lease until it expires.
func Ambiguous(err error) error {
	if err == nil {
		return nil
	}
	return ambiguousError{err}
}

// WithDisposition marks err with the disposition the work decided for
// itself: the Guard applies d whatever its Config.Classify says (an adapter
// with its own policy — httpidem maps status codes — works on any Guard).
// With a nil err the disposition still applies (Complete stores the value,
// Fail stores "failed").
func WithDisposition(d Disposition, err error) error {
	return &decidedError{d: d, err: err}
}

type decidedError struct {
	d   Disposition
	err error
}

func (e *decidedError) Error() string {
	if e.err == nil {
		return "idem: " + e.d.String()
	}
	return e.err.Error()
}

func (e *decidedError) Unwrap() error { return e.err }

// classify applies a disposition the work decided (WithDisposition), else
// the guard's policy.
func classify(policy func(error) Disposition, err error) Disposition {
	if err != nil {
		if de, ok := errors.AsType[*decidedError](err); ok {
			return de.d
		}
	}
	return policy(err)
}

// DefaultClassify is the default failure policy: nil → Complete; an error
// marked Permanent → Fail; an error marked Ambiguous, a deadline exceeded or
// a cancellation (context.Canceled: the caller gave up, or the lease was lost,
// while the work ran — its effect may have happened) → Hold; any other error
// → Release (transient: the retry runs the work).
func DefaultClassify(err error) Disposition {
	if err == nil {
		return Complete
	}
	if _, ok := errors.AsType[permanentError](err); ok {
		return Fail
	}
	if _, ok := errors.AsType[ambiguousError](err); ok || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return Hold
	}
	return Release
}

// ReplayedFailure is the error Do returns for a key whose first run failed
// definitely: the stored failure message, replayed without running the work.
type ReplayedFailure struct {
	Message string
}

func (e *ReplayedFailure) Error() string { return "idem: replayed failure: " + e.Message }
