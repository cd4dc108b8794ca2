package idem

import (
	"errors"

	"github.com/idemgo/idem/store"
)

// Errors of the Guard and of Do. A duplicate that was answered from the
// store is not an error: see Result.
var (
	// ErrInvalidKey reports a key that is empty, too long or holds control
	// characters. It is store.ErrInvalidKey.
	ErrInvalidKey = store.ErrInvalidKey
	// ErrStoreUnavailable wraps a failure to reach the store. No work runs
	// without a claim: the guard fails closed. It is store.ErrUnavailable.
	ErrStoreUnavailable = store.ErrUnavailable
	// ErrInProgress is returned by Do when another owner holds a live lease on
	// the key. The caller should retry later (HTTP 409, a broker nack with
	// delay).
	ErrInProgress = errors.New("idem: request in progress")
	// ErrFingerprintMismatch is returned by Do when the key was used before
	// with another request fingerprint: a client error, never a replay.
	ErrFingerprintMismatch = errors.New("idem: key reused with a different request")
	// ErrPoisoned is returned by Do when the key exceeded its attempt limit.
	ErrPoisoned = errors.New("idem: key poisoned after too many attempts")
	// ErrLeaseExpired is the cause (context.Cause) with which a Guard cancels
	// the context of work whose lease ran out because no heartbeat reached
	// the store in time (the store unreachable or too slow): from then on
	// another process may take the key over, so the work should stop. Its
	// fence may still be current — a settle that reaches the store before a
	// takeover succeeds.
	ErrLeaseExpired = errors.New("idem: the lease ran out: no heartbeat reached the store in time")
)
