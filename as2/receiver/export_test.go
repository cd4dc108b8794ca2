package receiver

import "github.com/idemgo/idem/internal/testsignal"

// ReadingSignal arms and returns the signal of a message whose body
// starts being read.
func ReadingSignal(rv *Receiver) *testsignal.Signal[struct{}] {
	rv.signals.reading.Init()
	return &rv.signals.reading
}
