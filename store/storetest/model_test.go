package storetest

import (
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/idemgo/idem/store"
)

// TestTakeoverOfAMomentaryClaim: the history a tiered-store campaign
// recorded under load (seed 3046965480135736403, times in ms from its
// start): p0's acquisition claimed the hot tier and waited 1.1 s on the
// cold one; meanwhile another caller took that claim over, released it,
// and a third acquired and completed the key; p0 was then answered with
// the replay. The takeover follows no claim handed out, so the strict
// model refuses the history; with TakeoverOfMomentaryClaims it is
// accepted. The same history with the takeover answered as a replay
// instead stays refused either way (a replay before any completion).
func TestTakeoverOfAMomentaryClaim(t *testing.T) {
	const f1, f3 = 1796080027640376, 1796080027648611
	result := "c1/A/p0/f1796080027648611"
	history := func(lax bool, second store.Outcome) []porcupine.Operation {
		op := func(client int, in opInput, out opOutput) porcupine.Operation { return c1Op(client, lax, in, out) }
		return []porcupine.Operation{
			op(0, opInput{Kind: opAcquire, FP: "A", Lease: 104, Ret: 616, Call: 0, Return: 1100},
				opOutput{Outcome: store.Replayed, State: store.StateCompleted, Result: result, ExpiresAt: 2276}),
			op(1, opInput{Kind: opAcquire, FP: "A", Lease: 309, Ret: 455, Call: 112, Return: 117},
				opOutput{Outcome: second, Fence: f1, Attempts: 1, LeaseUntil: 423, ExpiresAt: 621}),
			op(1, opInput{Kind: opRelease, Fence: f1, Call: 119, Return: 121}, opOutput{}),
			op(2, opInput{Kind: opAcquire, FP: "A", Lease: 105, Ret: 1128, Call: 120, Return: 129},
				opOutput{Outcome: store.Acquired, Fence: f3, Attempts: 2, LeaseUntil: 230, ExpiresAt: 1249}),
			op(2, opInput{Kind: opComplete, Fence: f3, Result: result, Ret: 1128, Call: 130, Return: 144}, opOutput{}),
		}
	}
	model := recordModel.ToModel()
	for _, c := range []struct {
		lax    bool
		second store.Outcome
		want   bool // linearizable
	}{
		{false, store.TakenOver, false},
		{true, store.TakenOver, true},
		{true, store.Acquired, true},
		{true, store.Replayed, false},
	} {
		if got := porcupine.CheckOperations(model, history(c.lax, c.second)); got != c.want {
			t.Errorf("lax=%v, second answered %v: linearizable %v, want %v", c.lax, c.second, got, c.want)
		}
	}
}

// TestInProgressFromAMomentaryClaim: the history of CI's tiered-store
// campaign (seed 9086440848421524875, times shortened): p0's acquisition
// claimed the hot tier and waited on the cold one through an outage;
// meanwhile p1 was answered InProgress by that claim, took it over once
// its lease ended and completed the key; p0 was then answered with the
// replay. The InProgress answer follows no claim handed out, so the strict
// model refuses the history; with TakeoverOfMomentaryClaims it is
// accepted, as an answer that runs nothing. A Mismatch answered by a
// momentary claim of the other fingerprint is the same case.
func TestInProgressFromAMomentaryClaim(t *testing.T) {
	const f2 = 1796105469720139
	result := "c1/A/p0/f1796105469720139"
	history := func(lax bool, fp string, seen store.Outcome) []porcupine.Operation {
		op := func(client int, in opInput, out opOutput) porcupine.Operation { return c1Op(client, lax, in, out) }
		return []porcupine.Operation{
			op(0, opInput{Kind: opAcquire, FP: "A", Lease: 214, Ret: 1489, Call: 0, Return: 1900},
				opOutput{Outcome: store.Replayed, State: store.StateCompleted, Result: result, ExpiresAt: 3000}),
			op(1, opInput{Kind: opAcquire, FP: fp, Lease: 392, Ret: 371, Call: 100, Return: 110},
				opOutput{Outcome: seen, LeaseUntil: 300, ExpiresAt: 1500}),
			op(1, opInput{Kind: opAcquire, FP: "A", Lease: 217, Ret: 988, Call: 1300, Return: 1310},
				opOutput{Outcome: store.TakenOver, Fence: f2, Attempts: 1, LeaseUntil: 1520, ExpiresAt: 2300}),
			op(1, opInput{Kind: opComplete, Fence: f2, Result: result, Ret: 988, Call: 1500, Return: 1510}, opOutput{}),
		}
	}
	model := recordModel.ToModel()
	for _, c := range []struct {
		lax  bool
		fp   string
		seen store.Outcome
		want bool // linearizable
	}{
		{false, "A", store.InProgress, false},
		{true, "A", store.InProgress, true},
		{true, "B", store.Mismatch, true},
		{true, "A", store.Replayed, false}, // a replay before any completion
	} {
		if got := porcupine.CheckOperations(model, history(c.lax, c.fp, c.seen)); got != c.want {
			t.Errorf("lax=%v, fp %s answered %v: linearizable %v, want %v", c.lax, c.fp, c.seen, got, c.want)
		}
	}
}

// TestInProgressFromAMomentaryTakeover: the history of CI's tiered-store
// campaign (seed 11833469257637893994, times shortened): p1's claim was
// left in flight by its dead owner; once its lease ended, p0's acquisition
// with MaxAttempts 1 took it over in the hot tier for a moment, asked the
// cold tier and poisoned the key; p2, arriving meanwhile, was answered
// InProgress by that momentary claim (an attempt more than the key ends
// with). The strict model refuses the history — before the poisoning the
// lease had ended, after it the key is poisoned; with
// TakeoverOfMomentaryClaims it is accepted, as an answer that runs nothing.
// A replay answered instead stays refused.
func TestInProgressFromAMomentaryTakeover(t *testing.T) {
	const f1 = 1796689024832365
	history := func(lax bool, seen store.Outcome) []porcupine.Operation {
		op := func(client int, in opInput, out opOutput) porcupine.Operation { return c1Op(client, lax, in, out) }
		return []porcupine.Operation{
			op(1, opInput{Kind: opAcquire, FP: "A", Lease: 100, Ret: 900, Call: 0, Return: 5},
				opOutput{Outcome: store.Acquired, Fence: f1, Attempts: 1, LeaseUntil: 100, ExpiresAt: 900}),
			op(0, opInput{Kind: opAcquire, FP: "A", Lease: 373, Ret: 1083, Max: 1, Call: 200, Return: 244},
				opOutput{Outcome: store.Poisoned, State: store.StatePoisoned, Attempts: 1, ExpiresAt: 1283}),
			op(2, opInput{Kind: opAcquire, FP: "A", Lease: 105, Ret: 393, Call: 207, Return: 224},
				opOutput{Outcome: seen, State: store.StateInFlight, Attempts: 2, LeaseUntil: 573, ExpiresAt: 1283}),
			op(2, opInput{Kind: opAcquire, FP: "A", Lease: 105, Ret: 393, Call: 300, Return: 310},
				opOutput{Outcome: store.Poisoned, State: store.StatePoisoned, Attempts: 1, ExpiresAt: 1283}),
		}
	}
	model := recordModel.ToModel()
	for _, c := range []struct {
		lax  bool
		seen store.Outcome
		want bool // linearizable
	}{
		{false, store.InProgress, false},
		{true, store.InProgress, true},
		{true, store.Replayed, false},
	} {
		if got := porcupine.CheckOperations(model, history(c.lax, c.seen)); got != c.want {
			t.Errorf("lax=%v, p2 answered %v: linearizable %v, want %v", c.lax, c.seen, got, c.want)
		}
	}
}

// c1Op is one operation on key c1 for the model tests, at the times in in.
func c1Op(client int, lax bool, in opInput, out opOutput) porcupine.Operation {
	in.Key, in.LaxTakeover = "c1", lax
	return porcupine.Operation{ClientId: client, Input: in, Call: in.Call, Output: out, Return: in.Return}
}

// TestAttemptsAndPoisoning: the model counts one attempt per claim handed
// out, less the claims given back by Unclaim, and accepts Poisoned only
// once an acquisition with a MaxAttempts finds that many: a key poisoned
// early (a message lost), run past its limit, or counted twice is refused.
func TestAttemptsAndPoisoning(t *testing.T) {
	acq := func(at int64, max int, out opOutput) porcupine.Operation {
		return c1Op(0, false, opInput{Kind: opAcquire, FP: "A", Lease: 100, Ret: 1000, Max: max, Call: at, Return: at + 1}, out)
	}
	claim := func(o store.Outcome, fence uint64, attempts int, at int64) opOutput {
		return opOutput{Outcome: o, Fence: fence, Attempts: attempts, LeaseUntil: at + 100, ExpiresAt: at + 1000}
	}
	giveBack := func(kind string, fence uint64, at int64) porcupine.Operation {
		return c1Op(0, false, opInput{Kind: kind, Fence: fence, Call: at, Return: at + 1}, opOutput{})
	}
	poison := opOutput{Outcome: store.Poisoned, State: store.StatePoisoned}
	releasedTwice := func(then ...porcupine.Operation) []porcupine.Operation {
		return append([]porcupine.Operation{
			acq(0, 2, claim(store.Acquired, 10, 1, 0)), giveBack(opRelease, 10, 5),
			acq(10, 2, claim(store.Acquired, 20, 2, 10)), giveBack(opRelease, 20, 15),
		}, then...)
	}
	model := recordModel.ToModel()
	for _, c := range []struct {
		name string
		h    []porcupine.Operation
		want bool
	}{
		{"released twice, poisoned at the third acquisition", releasedTwice(acq(20, 2, poison), acq(30, 0, poison)), true},
		{"run a third time", releasedTwice(acq(20, 2, claim(store.Acquired, 30, 3, 20))), false},
		{"poisoned early", []porcupine.Operation{
			acq(0, 2, claim(store.Acquired, 10, 1, 0)), giveBack(opRelease, 10, 5),
			acq(10, 2, poison)}, false},
		{"counted twice", []porcupine.Operation{
			acq(0, 0, claim(store.Acquired, 10, 1, 0)), giveBack(opRelease, 10, 5),
			acq(10, 0, claim(store.Acquired, 20, 3, 10))}, false},
		{"a takeover counts", []porcupine.Operation{
			acq(0, 2, claim(store.Acquired, 10, 1, 0)),
			acq(200, 2, claim(store.TakenOver, 20, 2, 200)),
			acq(400, 2, poison)}, true},
		{"an unclaim takes its attempt back", []porcupine.Operation{
			acq(0, 2, claim(store.Acquired, 10, 1, 0)), giveBack(opUnclaim, 10, 5),
			acq(10, 2, claim(store.Acquired, 20, 1, 10)), giveBack(opRelease, 20, 15),
			acq(20, 2, claim(store.Acquired, 30, 2, 20))}, true},
		{"a release does not", []porcupine.Operation{
			acq(0, 2, claim(store.Acquired, 10, 1, 0)), giveBack(opRelease, 10, 5),
			acq(10, 2, claim(store.Acquired, 20, 1, 10))}, false},
	} {
		if got := porcupine.CheckOperations(model, c.h); got != c.want {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.want)
		}
	}
}

// TestGetAnswersTheRecord: a Get answers the record as it stands — state,
// fingerprint, result, fence, attempts — or ErrNotFound only when it is
// absent or past its retention.
func TestGetAnswersTheRecord(t *testing.T) {
	const f = 10
	get := func(at int64, out opOutput) porcupine.Operation {
		return c1Op(1, false, opInput{Kind: opGet, Call: at, Return: at + 1}, out)
	}
	done := opOutput{State: store.StateCompleted, FP: "A", Fence: f, Result: "r", Attempts: 1}
	model := recordModel.ToModel()
	for _, c := range []struct {
		name string
		get  porcupine.Operation
		want bool
	}{
		{"the completed record", get(20, done), true},
		{"absent after its retention", get(2000, opOutput{Res: resAbsent}), true},
		{"absent while live", get(20, opOutput{Res: resAbsent}), false},
		{"another result", get(20, opOutput{State: store.StateCompleted, FP: "A", Fence: f, Result: "other", Attempts: 1}), false},
		{"in flight", get(20, opOutput{State: store.StateInFlight, FP: "A", Fence: f, Attempts: 1}), false},
		{"another fence", get(20, opOutput{State: store.StateCompleted, FP: "A", Fence: f + 1, Result: "r", Attempts: 1}), false},
		{"attempts counted twice", get(20, opOutput{State: store.StateCompleted, FP: "A", Fence: f, Result: "r", Attempts: 2}), false},
	} {
		h := []porcupine.Operation{
			c1Op(0, false, opInput{Kind: opAcquire, FP: "A", Lease: 100, Ret: 1000, Call: 0, Return: 1},
				opOutput{Outcome: store.Acquired, Fence: f, Attempts: 1, LeaseUntil: 100, ExpiresAt: 1000}),
			c1Op(0, false, opInput{Kind: opComplete, Fence: f, Result: "r", Ret: 1000, Call: 5, Return: 6}, opOutput{}),
			c.get,
		}
		if got := porcupine.CheckOperations(model, h); got != c.want {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.want)
		}
	}
}

// TestPoisonOfAMomentaryClaim: the history of a tiered-store campaign
// (seed 13447889491361254046, times shortened): a duplicate's momentary hot
// claim outlived its lease — its give-back held up by a stall of the hot
// tier — on a key whose completion had just expired, and an acquisition
// with MaxAttempts 1 took it over and poisoned the key, which no claim had
// run. The strict model refuses it (the key was absent: Acquired was due);
// with TakeoverOfMomentaryClaims it is accepted, and the poisoned record
// then answers Poisoned.
func TestPoisonOfAMomentaryClaim(t *testing.T) {
	history := func(lax bool) []porcupine.Operation {
		op := func(client int, in opInput, out opOutput) porcupine.Operation { return c1Op(client, lax, in, out) }
		return []porcupine.Operation{
			op(0, opInput{Kind: opAcquire, FP: "A", Lease: 100, Ret: 200, Call: 0, Return: 1},
				opOutput{Outcome: store.Acquired, Fence: 10, Attempts: 1, LeaseUntil: 100, ExpiresAt: 200}),
			op(0, opInput{Kind: opComplete, Fence: 10, Result: "r", Ret: 200, Call: 2, Return: 3}, opOutput{}),
			op(1, opInput{Kind: opAcquire, FP: "A", Lease: 300, Ret: 300, Max: 1, Call: 190, Return: 700},
				opOutput{Outcome: store.Poisoned, State: store.StatePoisoned, Attempts: 1}),
			op(2, opInput{Kind: opAcquire, FP: "A", Lease: 300, Ret: 300, Call: 710, Return: 711},
				opOutput{Outcome: store.Poisoned, State: store.StatePoisoned, Attempts: 1}),
		}
	}
	model := recordModel.ToModel()
	for _, lax := range []bool{false, true} {
		if got := porcupine.CheckOperations(model, history(lax)); got != lax {
			t.Errorf("lax=%v: linearizable %v, want %v", lax, got, lax)
		}
	}
}

// TestFailedPoisoningLeavesTheClaimGivenBack: the tiered store's history
// (campaign seed 8204860326311561358, times shortened): a claim's lease
// ended; an acquisition with MaxAttempts 1 took the claim over (past its
// MaxAttempts, so as not to poison a key settled in the cold tier), found
// nothing settled, gave the claim back and failed; meanwhile another
// acquisition was answered Acquired on the claim given back. The strict
// model refuses it (an acquisition at MaxAttempts poisons or changes
// nothing); with TakeoverOfMomentaryClaims it is accepted.
func TestFailedPoisoningLeavesTheClaimGivenBack(t *testing.T) {
	history := func(lax bool) []porcupine.Operation {
		op := func(client int, in opInput, out opOutput) porcupine.Operation { return c1Op(client, lax, in, out) }
		return []porcupine.Operation{
			op(0, opInput{Kind: opAcquire, FP: "A", Lease: 100, Ret: 5000, Call: 0, Return: 1},
				opOutput{Outcome: store.Acquired, Fence: 10, Attempts: 1, LeaseUntil: 100, ExpiresAt: 5000}),
			op(1, opInput{Kind: opAcquire, FP: "A", Lease: 250, Ret: 500, Max: 1, Call: 150, Return: 1150},
				opOutput{Res: resUnknown}),
			op(2, opInput{Kind: opAcquire, FP: "A", Lease: 370, Ret: 1400, Call: 151, Return: 158},
				opOutput{Outcome: store.Acquired, Fence: 20, Attempts: 2, LeaseUntil: 520, ExpiresAt: 1560}),
		}
	}
	model := recordModel.ToModel()
	for _, lax := range []bool{false, true} {
		if got := porcupine.CheckOperations(model, history(lax)); got != lax {
			t.Errorf("lax=%v: linearizable %v, want %v", lax, got, lax)
		}
	}
}
