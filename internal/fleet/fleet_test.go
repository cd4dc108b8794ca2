package fleet_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/fleet"
)

const ready = "FLEET HELPER READY"

// TestFleet starts two helpers, freezes one, kills one (a third takes its
// place) and checks what the fleet remembers; StopAll ends the rest.
func TestFleet(t *testing.T) {
	if n := os.Getenv("IDEM_FLEET_HELPER"); n != "" {
		fmt.Println(ready)
		time.Sleep(time.Minute) // until killed
		return
	}
	f := fleet.New(t, "TestFleet", ready, nil, func(n int) []string { return []string{"IDEM_FLEET_HELPER=" + strconv.Itoa(n)} })
	f.Spawn()
	f.Spawn()
	if f.Len() != 2 {
		t.Fatalf("%d helpers, want 2", f.Len())
	}
	rng := rand.New(rand.NewPCG(1, 2))
	before := time.Now().UnixNano()
	if f.AnyFrozenDuring(0, before) {
		t.Fatal("a helper remembered as frozen before any was")
	}
	f.FreezeOne(rng, time.Hour) // thawed by ThawAll, not by its timer
	if !f.AnyFrozenDuring(before, time.Now().UnixNano()) {
		t.Fatal("the helper frozen now is not seen by AnyFrozenDuring")
	}
	f.ThawAll()
	after := time.Now().UnixNano()
	if !f.FrozenDuring(1, before, after) && !f.FrozenDuring(2, before, after) {
		t.Fatal("no helper remembered as frozen")
	}
	if f.FrozenDuring(1, after+1, after+int64(time.Hour)) || f.FrozenDuring(2, after+1, after+int64(time.Hour)) {
		t.Fatal("a helper remembered as frozen after ThawAll")
	}
	if !f.LostDuring(1, before, after) && !f.LostDuring(2, before, after) {
		t.Fatal("LostDuring does not see the freeze")
	}
	if !f.AnyFrozenDuring(before, after) || f.AnyFrozenDuring(after+1, after+int64(time.Hour)) {
		t.Fatal("AnyFrozenDuring does not follow the freeze")
	}
	f.KillOne(rng)
	if f.Len() != 2 {
		t.Fatalf("%d helpers after a kill, want 2 (one replaced)", f.Len())
	}
	_, k1 := f.KilledAt(1)
	_, k2 := f.KilledAt(2)
	if k1 == k2 {
		t.Fatalf("killed: helper 1 %v, helper 2 %v; want exactly one", k1, k2)
	}
	if got := len(f.KilledMillis()); got != 1 {
		t.Fatalf("%d kills remembered, want 1", got)
	}
	f.StopAll()
	if f.Len() != 0 {
		t.Fatalf("%d helpers after StopAll", f.Len())
	}
}

// TestDumpAll: the processes end on SIGQUIT (their goroutines' stacks go to
// the test's stderr) without waiting for them to end on their own.
func TestDumpAll(t *testing.T) {
	if os.Getenv("IDEM_FLEET_HELPER") != "" {
		fmt.Println(ready)
		time.Sleep(time.Minute) // until dumped
		return
	}
	f := fleet.New(t, "TestDumpAll", ready, nil, func(n int) []string { return []string{"IDEM_FLEET_HELPER=" + strconv.Itoa(n)} })
	f.Spawn()
	f.FreezeOne(rand.New(rand.NewPCG(1, 2)), time.Hour) // a frozen one is thawed to dump
	start := time.Now()
	f.DumpAll()
	if f.Len() != 0 || time.Since(start) > 30*time.Second {
		t.Fatalf("%d helpers left, %v after DumpAll began", f.Len(), time.Since(start))
	}
}
