package store

import "errors"

// Sentinel errors. Stores wrap their native errors so that errors.Is works
// with these.
var (
	// ErrNotFound is returned by Get for a key the store does not hold (never
	// seen, deleted, or past its retention).
	ErrNotFound = errors.New("idem: record not found")
	// ErrStaleFence is returned by Heartbeat, Complete, Fail and Release when
	// the caller's fence is no longer the record's current fence (the lease was
	// taken over, or the record was settled, deleted or expired). Nothing was
	// changed.
	ErrStaleFence = errors.New("idem: stale fence: the lease belongs to another owner")
	// ErrUnavailable wraps a failure to reach the store (idem.ErrStoreUnavailable
	// is the same error).
	ErrUnavailable = errors.New("idem: store unavailable")
	// ErrClosed is returned by a store used after Close.
	ErrClosed = errors.New("idem: store closed")
	// ErrInvalidKey reports a storage key that is empty or too long
	// (idem.ErrInvalidKey is the same error).
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
)
