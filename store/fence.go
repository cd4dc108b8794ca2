package store

import (
	"sync/atomic"
	"time"
)

// FenceFloor is the smallest fence a store issues at time now: the time in
// microseconds since the Unix epoch. Every acquisition issues
// max(previous fence of the record + 1, FenceFloor(store clock)), so fences
// of a key keep growing after its record was deleted, swept or expired: the
// new generation starts above the clock, and the old one never got past the
// clock by more than one per acquisition within the same microsecond.
func FenceFloor(now time.Time) uint64 {
	us := now.UnixMicro()
	if us < 1 {
		return 1
	}
	return uint64(us)
}

// FenceSequence hands out fences that strictly increase within the process
// and never fall below FenceFloor of the clock: a hybrid logical clock. It
// makes fences strictly increasing across generations even when the clock
// stands still or steps back (an injected test clock, an NTP step). The zero
// value is ready to use and safe for concurrent use.
type FenceSequence struct{ last atomic.Uint64 }

// Next returns a fence larger than prev, than every fence this sequence
// returned before, and at least FenceFloor(now).
func (s *FenceSequence) Next(now time.Time, prev uint64) uint64 {
	f := max(FenceFloor(now), prev+1)
	for {
		last := s.last.Load()
		if f <= last {
			f = last + 1
		}
		if s.last.CompareAndSwap(last, f) {
			return f
		}
	}
}
