package idem

import "errors"

// Sentinel errors. Backends wrap their native errors so that errors.Is works
// with these.
var (
	// ErrInvalidKey reports a key that is empty, too long or holds control
	// characters.
	ErrInvalidKey = errors.New("idem: invalid key")
	// ErrInvalidFingerprint reports a fingerprint longer than MaxFingerprintBytes.
	ErrInvalidFingerprint = errors.New("idem: invalid fingerprint")
	// ErrResultTooLarge reports a result over the store's MaxResultBytes.
	ErrResultTooLarge = errors.New("idem: result too large")
	// ErrInvalidLease reports a lease that is not positive or above MaxLease.
	ErrInvalidLease = errors.New("idem: invalid lease")
	// ErrInvalidRetention reports a retention that is not positive or above
	// MaxRetention.
	ErrInvalidRetention = errors.New("idem: invalid retention")
	// ErrStaleFence is returned by Heartbeat, Complete, Fail and Release when
	// the caller's fence is no longer the record's current fence (the lease was
	// taken over, or the record was settled, deleted or expired). Nothing was
	// changed.
	ErrStaleFence = errors.New("idem: stale fence: the lease belongs to another owner")
	// ErrLeaseExpired is the cause (context.Cause) with which a Guard cancels
	// the context of work whose lease ran out because no heartbeat reached
	// the store in time (the store unreachable or too slow): from then on
	// another process may take the key over, so the work should stop. Its
	// fence may still be current — a settle that reaches the store before a
	// takeover succeeds.
	ErrLeaseExpired = errors.New("idem: the lease ran out: no heartbeat reached the store in time")
	// ErrNotFound is returned by Get for a key the store does not hold (never
	// seen, deleted, or past its retention).
	ErrNotFound = errors.New("idem: record not found")
	// ErrInProgress is returned by Do when another owner holds a live lease on
	// the key. The caller should retry later (HTTP 409, a broker nack with
	// delay).
	ErrInProgress = errors.New("idem: request in progress")
	// ErrFingerprintMismatch is returned by Do when the key was used before
	// with another request fingerprint: a client error, never a replay.
	ErrFingerprintMismatch = errors.New("idem: key reused with a different request")
	// ErrPoisoned is returned by Do when the key exceeded its attempt limit.
	ErrPoisoned = errors.New("idem: key poisoned after too many attempts")
	// ErrStoreUnavailable wraps a failure to reach the store. No work runs
	// without a claim: the guard fails closed.
	ErrStoreUnavailable = errors.New("idem: store unavailable")
	// ErrClosed is returned by a store used after Close.
	ErrClosed = errors.New("idem: store closed")
)
