package outbox

import "github.com/idemgo/idem/internal/testsignal"

// ArmIdleSignal arms the relay's Idle signal (before Start) and returns it.
func ArmIdleSignal(r *Relay) *testsignal.Signal[struct{}] {
	r.signals.Idle.Init()
	return &r.signals.Idle
}

// ConflictsQuery is the ordering keys' check of a claim (keyConflicts) for
// n keys, its parameters $1 (a claim token) and $2… (the keys).
func ConflictsQuery(s *Store, n int) string {
	cond, _ := inStrings("ordering_key", 2, make([]string, n))
	return s.q.conflicts + cond
}
