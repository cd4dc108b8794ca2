package broker

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// Message is the view of a delivery the key extractors need.
type Message interface {
	// Header returns the value of a message header ("" when absent).
	Header(name string) string
	// Body returns the payload.
	Body() []byte
}

// KeyFunc extracts the producer's business id from a message. It must not
// return the broker's message id: that changes when a message is replayed
// from a dead-letter queue or an archive.
type KeyFunc func(Message) (string, error)

// HeaderKey reads the id from a header.
func HeaderKey(name string) KeyFunc {
	return func(m Message) (string, error) {
		if v := m.Header(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("idem/broker: the message has no %s header", name)
	}
}

// FingerprintFunc tells a message's payload apart, so that a key reused
// with another payload is a Mismatch (dead-lettered) rather than a replay.
type FingerprintFunc func(Message) string

// BodyFingerprint is the SHA-256/128 of the body (idem.Fingerprint): the
// default.
func BodyFingerprint(m Message) string { return idem.Fingerprint(m.Body()) }

// NoFingerprint trusts the producer's keys: a key reused with another
// payload replays the first result instead of being dead-lettered, and no
// body is hashed.
func NoFingerprint(Message) string { return "" }

// Verdict is what to tell the broker.
type Verdict uint8

// The verdicts.
const (
	// Ack: done (or a duplicate of something done): remove the message.
	Ack Verdict = 1
	// Retry: redeliver after Decision.Delay.
	Retry Verdict = 2
	// DeadLetter: never process it; route it to the dead-letter destination.
	DeadLetter Verdict = 3
)

func (v Verdict) String() string {
	switch v {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead-letter"
	}
	return "verdict(?)"
}

// Decision is a verdict with its delay and reason.
type Decision struct {
	Verdict Verdict
	Delay   time.Duration
	Reason  string
}

// Policy maps outcomes to decisions. The zero value works.
type Policy struct {
	// InProgressDelay is how long to wait before redelivering a message
	// whose key another consumer is processing. Defaults to 5s.
	InProgressDelay time.Duration
	// BackoffMin and BackoffMax bound the exponential backoff, with full
	// jitter, of a transient failure's redelivery. Default to 1s and 1m.
	BackoffMin, BackoffMax time.Duration
}

// Backoff returns the delay before redelivery number attempt (1-based):
// uniform in [0, min(max, min·2^(attempt-1))], at least 10ms.
func (p Policy) Backoff(attempt int) time.Duration {
	lo, hi := p.BackoffMin, p.BackoffMax
	if lo <= 0 {
		lo = time.Second
	}
	if hi <= 0 {
		hi = time.Minute
	}
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return max(time.Duration(rand.Int64N(int64(d)+1)), 10*time.Millisecond)
}

// FromGuard decides for a delivery run through idem.Guard.Run; attempt is
// the broker's delivery count.
func (p Policy) FromGuard(res idem.Result, err error, attempt int) Decision {
	inProgress := p.InProgressDelay
	if inProgress <= 0 {
		inProgress = 5 * time.Second
	}
	if res.Outcome.Owns() {
		switch res.Disposition {
		case idem.Complete, idem.Fail:
			if err != nil && res.Disposition == idem.Complete {
				// Done, but not recorded: redeliver; the record is still in
				// flight, so the redelivery waits for the lease.
				return Decision{Retry, inProgress, err.Error()}
			}
			return Decision{Verdict: Ack}
		case idem.Hold:
			return Decision{Retry, inProgress, "held: the outcome is ambiguous"}
		default:
			reason := "released"
			if err != nil {
				reason = err.Error()
			}
			return Decision{Retry, p.Backoff(attempt), reason}
		}
	}
	if err != nil {
		// No claim (the store failed, or the key is invalid): nothing ran.
		if errors.Is(err, idem.ErrInvalidKey) {
			return Decision{DeadLetter, 0, err.Error()}
		}
		return Decision{Retry, p.Backoff(attempt), err.Error()}
	}
	switch res.Outcome {
	case store.Replayed:
		return Decision{Verdict: Ack}
	case store.InProgress:
		return Decision{Retry, inProgress, "in progress elsewhere"}
	case store.Mismatch:
		return Decision{DeadLetter, 0, "the key was used before with another payload"}
	case store.Poisoned:
		return Decision{DeadLetter, 0, "poisoned: too many attempts"}
	}
	return Decision{Retry, p.Backoff(attempt), "unexpected outcome " + res.Outcome.String()}
}

// FromInbox decides for a delivery run through the transactional inbox:
// out is the inbox's outcome (processed, duplicate, stale — each acked), err
// a failed transaction (retried: nothing committed).
func (p Policy) FromInbox(out fmt.Stringer, err error, attempt int) Decision {
	if err != nil {
		return Decision{Retry, p.Backoff(attempt), err.Error()}
	}
	return Decision{Verdict: Ack, Reason: out.String()}
}
