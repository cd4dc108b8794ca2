package outbox

import "github.com/idemgo/idem/internal/testsignal"

// ArmIdleSignal arms the relay's Idle signal (before Start) and returns it.
func ArmIdleSignal(r *Relay) *testsignal.Signal[struct{}] {
	r.signals.Idle.Init()
	return &r.signals.Idle
}
