package model_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/idemgo/idem/internal/testenv"
)

// A check of a model: its bounds and flags, and whether it must hold.
type check struct {
	name  string
	model string   // the .pml file
	defs  []string // -D flags
	live  bool     // the LTL property under weak fairness, not the assertions
	fail  bool     // a mutation: a counterexample is expected
}

// TestRecordProtocol checks record.pml exhaustively at its bounds — two
// workers on one key with four claims, two on two keys and three on one
// with three — its liveness property under weak fairness (two workers on
// one key), and that each mutation of a rule the stores keep
// yields a counterexample.
func TestRecordProtocol(t *testing.T) {
	t.Parallel() // beside TestOutbox: each check is one process on one core
	checks := []check{
		{name: "N=2 K=1 C=4", model: "record.pml", defs: []string{"N=2", "K=1", "C=4"}},
		{name: "N=2 K=2 C=3", model: "record.pml", defs: []string{"N=2", "K=2", "C=3"}},
		{name: "N=3 K=1 C=3", model: "record.pml", defs: []string{"N=3", "K=1", "C=3"}},
		{name: "liveness N=2 K=1 C=3", model: "record.pml", defs: []string{"N=2", "K=1", "C=3", "NO_FORGET"}, live: true},
	}
	for _, m := range []string{"MUT_SETTLE_IGNORES_FENCE", "MUT_SETTLE_ANY_STATE", "MUT_NO_FENCE_FLOOR", "MUT_HEARTBEAT_ANY_STATE", "MUT_REPLAY_UNSETTLED"} {
		checks = append(checks, check{name: m, model: "record.pml", defs: []string{"N=2", "K=1", "C=3", m}, fail: true})
	}
	checks = append(checks, check{name: "MUT_LEASE_NEVER_ENDS", model: "record.pml", defs: []string{"N=2", "K=1", "C=3", "NO_FORGET", "MUT_LEASE_NEVER_ENDS"}, live: true, fail: true})
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { run(t, c) })
	}
}

// TestOutbox checks outbox.pml exhaustively at its bounds — two relays,
// three rows (two of one ordering key), three claims and two acts of an
// operator or a receipt, with and without DeadRowsReleaseOrderingKeys —
// and that each mutation of a rule the relay and its claim keep yields a
// counterexample.
func TestOutbox(t *testing.T) {
	t.Parallel()
	checks := []check{
		{name: "P=2 C=3 OPS=2", model: "outbox.pml", defs: []string{"P=2", "C=3", "OPS=2"}},
		{name: "P=2 C=3 OPS=2 PAST_DEAD", model: "outbox.pml", defs: []string{"P=2", "C=3", "OPS=2", "PAST_DEAD"}},
	}
	for _, m := range []string{"MUT_CLAIM_IGNORES_ORDER", "MUT_CLAIM_BESIDE_A_CLAIM", "MUT_DEAD_RELEASES_KEY", "MUT_MARK_SENT_ANY_STATUS", "MUT_MARK_SENT_ANY_CLAIM", "MUT_KEY_PER_ATTEMPT"} {
		checks = append(checks, check{name: m, model: "outbox.pml", defs: []string{"P=2", "C=3", "OPS=2", m}, fail: true})
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { run(t, c) })
	}
}

// TestTieredStore checks tiered.pml exhaustively at its bounds — two
// workers on one key with four claims (every run of fewer is a prefix of
// one of them), the cold tier down once and one archive applied late, and
// a restart of the hot tier that loses every record (or none); with three
// claims, a failover of a hot tier whose writes wait for its replica — and
// that each mutation of a rule the tiered store keeps yields a
// counterexample.
func TestTieredStore(t *testing.T) {
	t.Parallel()
	checks := []check{
		// The restart may happen or not: each check covers the runs without it.
		{name: "N=2 C=4 RESTART", model: "tiered.pml", defs: []string{"N=2", "C=4", "RESTART"}},
	}
	for _, m := range []string{"MUT_NO_COLD_READ", "MUT_COLD_FAILS_OPEN", "MUT_HOT_BEFORE_ARCHIVE", "MUT_NO_LEASE_EXTENSION", "MUT_NO_AWAIT_ARCHIVES", "MUT_NO_CLAIM_RECHECK", "MUT_NO_FENCE_FLOOR", "MUT_ARCHIVE_FAILS_OPEN", "MUT_TOMBSTONE_AS_SETTLED", "MUT_TAKEOVER_LIVE_LEASE"} {
		checks = append(checks, check{name: m, model: "tiered.pml", defs: []string{"N=2", "C=3", "RESTART", m}, fail: true})
	}
	// A failover of a hot tier whose writes wait for the replica
	// (redisstore's WaitReplicas): it may happen or not, and any write may
	// be answered with a shortfall while it stands on the primary.
	checks = append(checks,
		check{name: "N=2 C=3 FAILOVER WAITED", model: "tiered.pml", defs: []string{"N=2", "C=3", "FAILOVER", "WAITED"}},
		check{name: "MUT_NO_WAIT", model: "tiered.pml", defs: []string{"N=2", "C=3", "FAILOVER", "WAITED", "MUT_NO_WAIT"}, fail: true})
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { run(t, c) })
	}
}

var (
	errorsLine = regexp.MustCompile(`errors: (\d+)`)
	statesLine = regexp.MustCompile(`(\d+) states, stored`)
)

// run generates the verifier of c's model with spin, compiles it with gcc
// and runs it: safety (assertions, invalid end states) or, for c.live, the
// model's LTL property with weak fairness.
func run(t *testing.T, c check) {
	if testing.Short() {
		t.Skip("-short: the models take minutes; go test ./internal/model checks them")
	}
	spin, err := exec.LookPath("spin")
	testenv.Need(t, "spin", "PATH", err)
	gcc, err := exec.LookPath("gcc")
	testenv.Need(t, "gcc", "PATH", err)
	model, err := filepath.Abs(c.model)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	runIn(t, dir, spin, append(append([]string{"-a"}, defs(c.defs)...), model)...)
	opt := "-O2"
	if c.fail {
		opt = "-O0" // a mutation's counterexample comes within a few thousand states: compile fast
	}
	cflags := []string{opt, "-w", "-DCOLLAPSE", "-DNFAIR=4", "-o", "pan", "pan.c"}
	if !c.live {
		cflags = append([]string{"-DSAFETY", "-DNOCLAIM"}, cflags...)
	}
	runIn(t, dir, gcc, cflags...)
	pan := []string{"-m200000", "-w26"}
	if c.live {
		pan = append(pan, "-a", "-f")
	}
	out := runIn(t, dir, filepath.Join(dir, "pan"), pan...)
	m := errorsLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("pan printed no error count:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	states := ""
	if s := statesLine.FindStringSubmatch(out); s != nil {
		states = s[1] + " states"
	}
	switch {
	case c.fail && n == 0:
		t.Fatalf("the mutation %v yields no counterexample (%s):\n%s", c.defs, states, out)
	case !c.fail && n > 0:
		trail, _ := exec.Command(spin, append(append([]string{"-t", "-p"}, defs(c.defs)...), model)...).CombinedOutput()
		t.Fatalf("%d errors (%s):\n%s\ncounterexample:\n%s", n, states, out, trail)
	case !c.fail && regexp.MustCompile(`max search depth too small`).MatchString(out):
		t.Fatalf("the search was cut at its depth bound:\n%s", out)
	}
	t.Logf("%d errors, %s", n, states)
}

func defs(ds []string) []string {
	var out []string
	for _, d := range ds {
		out = append(out, "-D"+d)
	}
	return out
}

// runIn runs name with args in dir and returns what it printed; a failure
// to run fails t.
func runIn(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func TestMain(m *testing.M) {
	if _, err := os.Stat("record.pml"); err != nil {
		fmt.Fprintln(os.Stderr, "run from internal/model:", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}
