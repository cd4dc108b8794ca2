// Package natsidem makes NATS JetStream consumers idempotent: a thin layer
// that runs each message through an idem.Guard (store-based) or the
// transactional inbox, and tells JetStream what happened:
//
//	duplicate of a done message   → Ack
//	in progress elsewhere         → NakWithDelay (Policy.InProgressDelay)
//	transient failure             → NakWithDelay (exponential backoff with jitter)
//	poisoned, or key reused       → Term, after republishing to DeadLetterSubject if set
//	long work                     → InProgress every ProgressInterval, so AckWait does not expire
package natsidem
