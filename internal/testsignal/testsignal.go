// Package testsignal lets code tell a test that something happened, so the
// test waits on the event instead of sleeping (river's testsignal is the
// model). A Signal is inert — one nil check — until a test calls Init
// before the code under test starts.
package testsignal

import (
	"testing"
	"time"
)

// Signal carries events of type T from the code to a test.
type Signal[T any] struct{ ch chan T }

// Init arms the signal. Call it before the code that signals starts.
func (s *Signal[T]) Init() { s.ch = make(chan T, 1000) }

// Signal records v if the signal is armed; it never blocks (an event no
// test waits for is dropped once 1000 are queued).
func (s *Signal[T]) Signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
	}
}

// WaitOrTimeout returns the next event, failing t after 10 seconds.
func (s *Signal[T]) WaitOrTimeout(t testing.TB) T {
	t.Helper()
	select {
	case v := <-s.ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("testsignal: no event within 10s")
		var zero T
		return zero
	}
}
