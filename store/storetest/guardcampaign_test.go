package storetest

import (
	"testing"
	"time"
)

// TestSettleLostToASlowCrash: the run a PostgreSQL Guard campaign flagged
// in CI (seed 4455183779600083524, times from the campaign's start): the
// work of key 4 succeeded at 3.30 s, and the campaign crashed the server
// then; the server was still recovering ("not yet accepting connections")
// at the settle's last try at 5.10 s and the heartbeat at 5.18 s, when the
// Guard's count of the lease ran out and Run returned unsettled. A crash
// that keeps the server away for longer than guardRideOut may cost a
// settle, as a cut longer than a lease may; a quick one may not, and
// neither may a kill of another process.
func TestSettleLostToASlowCrash(t *testing.T) {
	ms := func(ms int64) int64 { return ms * int64(time.Millisecond) }
	run := guardRun{key: "4", fence: 1796362887000805, proc: -1, start: ms(2500), end: ms(3300), did: runSucceeded, settleEnd: ms(5200)}
	slow := [][2]int64{{ms(3300), ms(5300)}}
	quick := [][2]int64{{ms(3300), ms(3300) + int64(guardRideOut) - ms(100)}}
	for _, c := range []struct {
		name          string
		cuts, crashes [][2]int64
		killedAt      map[int]int64
		excused       bool
	}{
		{name: "a crash down 2 s", crashes: slow, excused: true},
		{name: "no outage", excused: false},
		{name: "a crash down less than guardRideOut", crashes: quick, excused: false},
		{name: "a long cut", cuts: slow, excused: true},
		{name: "a slow crash a lease after the run's Run returned", crashes: [][2]int64{{ms(8300), ms(10300)}}, excused: false},
		{name: "a kill of another process", crashes: quick, killedAt: map[int]int64{1: 3400}, excused: false},
		{name: "a kill of the run's process before its Run returned", killedAt: map[int]int64{-1: 3400}, excused: true},
	} {
		if got := settleExcused(run, c.killedAt, unriddenOutages(c.cuts, c.crashes)); got != c.excused {
			t.Errorf("%s: excused %v, want %v", c.name, got, c.excused)
		}
	}
	if guardRideOut <= 700*time.Millisecond { // the longest stall the campaigns inject
		t.Errorf("guardRideOut %v: the stalls and cuts the campaigns inject would cost settles", guardRideOut)
	}
}
