package mono

import (
	"testing"
	"time"
)

func TestNowFollowsTheMonotonicClock(t *testing.T) {
	a, wa := Now(), time.Now()
	time.Sleep(10 * time.Millisecond)
	b, wb := Now(), time.Now()
	if d := b.Sub(a); d < 10*time.Millisecond || d > wb.Sub(wa)+time.Millisecond {
		t.Fatalf("Now advanced %v over a sleep of 10ms that time.Now saw as %v", d, wb.Sub(wa))
	}
	if d := a.Wall().Sub(wa); d < -time.Millisecond || d > time.Millisecond {
		t.Fatalf("Wall is %v off time.Now", d)
	}
	if u := time.Until(b.Add(time.Hour).Wall()); u < 59*time.Minute || u > time.Hour {
		t.Fatalf("time.Until of a Wall an hour ahead: %v", u)
	}
	if u := Until(Now().Add(time.Hour)); u < 59*time.Minute || u > time.Hour {
		t.Fatalf("Until an hour ahead: %v", u)
	}
}

func BenchmarkNow(b *testing.B) {
	for b.Loop() {
		Now()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		time.Now()
	}
}
