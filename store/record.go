package store

import (
	"fmt"
	"time"
)

// State is the phase of a record.
type State uint8

// The states of a record. The numbers are stored by the backends: never
// renumber them.
const (
	// StateInFlight: an owner holds (or held, if LeaseUntil passed) a lease.
	StateInFlight State = 1
	// StateCompleted: done; Result is replayed to duplicates until expiry.
	StateCompleted State = 2
	// StateFailed: a definite business failure; Result (the failure) is
	// replayed to duplicates until expiry.
	StateFailed State = 3
	// StatePoisoned: the attempt limit was reached; no more work runs.
	StatePoisoned State = 4
	// StateReleased: the owner gave the lease back (a transient failure); the
	// next delivery runs the work again. Attempts are kept.
	StateReleased State = 5
)

func (s State) String() string {
	switch s {
	case StateInFlight:
		return "in-flight"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	case StatePoisoned:
		return "poisoned"
	case StateReleased:
		return "released"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// ParseState is the inverse of State.String.
func ParseState(s string) (State, error) {
	for st := StateInFlight; st <= StateReleased; st++ {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("idem: unknown state %q (want in-flight, completed, failed, poisoned or released)", s)
}

// Record is what a store holds for one key.
type Record struct {
	// Key is the storage key (see Key.Storage).
	Key   string
	State State
	// Fence is the fencing token of the latest acquisition — or, for a
	// poisoned record, of the poisoning, which takes one of its own so that
	// nothing fenced on the claim it ended touches it. It is strictly
	// larger than every fence issued earlier for the key, also by a deleted,
	// swept or expired record (see Store).
	Fence uint64
	// Fingerprint of the request that created the record.
	Fingerprint string
	// Attempts counts acquisitions (first run, re-runs after release,
	// takeovers).
	Attempts int
	// Result is the stored outcome of the work (completed or failed).
	Result []byte
	// LeaseUntil is when the current lease ends (zero when not in flight).
	LeaseUntil time.Time
	// ExpiresAt is when the store forgets the record (retention).
	ExpiresAt time.Time
	// UpdatedAt is the time of the last transition.
	UpdatedAt time.Time
}

// Outcome is what an acquisition found. A duplicate is an outcome, not an
// error.
type Outcome uint8

// The outcomes of Store.Acquire.
const (
	// Acquired: the key was absent (or released, or past retention); run
	// the work under Fence.
	Acquired Outcome = 1
	// TakenOver: the previous owner's lease expired; run the work again under
	// a strictly larger Fence.
	TakenOver Outcome = 2
	// InProgress: another owner holds a live lease. Retry later.
	InProgress Outcome = 3
	// Replayed: the record is completed or failed; Record holds the result.
	Replayed Outcome = 4
	// Mismatch: the key exists with another fingerprint. Nothing changed.
	Mismatch Outcome = 5
	// Poisoned: the attempt limit is reached; route to a dead-letter
	// destination.
	Poisoned Outcome = 6
)

func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case TakenOver:
		return "taken-over"
	case InProgress:
		return "in-progress"
	case Replayed:
		return "replayed"
	case Mismatch:
		return "mismatch"
	case Poisoned:
		return "poisoned"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Owns reports whether the caller now holds the lease and must run the work.
func (o Outcome) Owns() bool { return o == Acquired || o == TakenOver }

// AcquireRequest asks a store to claim a key.
type AcquireRequest struct {
	// Key is the storage key (see Key.Storage).
	Key string
	// Fingerprint of the request; compared exactly with the stored one.
	Fingerprint string
	// Lease is how long the claim lives without a heartbeat.
	Lease time.Duration
	// Retention is how long an unsettled record (in flight, released,
	// poisoned) is kept; it never ends before the lease.
	Retention time.Duration
	// MaxAttempts poisons the key when an acquisition would exceed it.
	// Zero means no limit.
	MaxAttempts int
}

// Acquisition is the answer to an acquire.
type Acquisition struct {
	Outcome Outcome
	// Fence is the fencing token the owner must present to settle or
	// heartbeat; valid when Outcome.Owns().
	Fence uint64
	// Record is the record as the store left it after the acquisition.
	Record Record
}
