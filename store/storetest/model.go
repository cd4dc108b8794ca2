package storetest

import (
	"fmt"
	"math"

	"github.com/anishathalye/porcupine"

	"github.com/idemgo/idem/store"
)

// The campaign's sequential model of one key's record, for porcupine. Time
// is in milliseconds of the wall clock, which is the store's clock too (every
// backend under test runs on this machine); slack absorbs the stores'
// millisecond rounding.
const slackMs = 3

// Operation kinds in a campaign history.
const (
	opAcquire   = "acquire"
	opComplete  = "complete"
	opFail      = "fail"
	opRelease   = "release"
	opHeartbeat = "heartbeat"
	opDelete    = "delete"
	opUnclaim   = "unclaim"
	opPoison    = "poison claim"
	opGet       = "get"
)

// opInput is what a worker asked, with the wall-clock interval of the call
// (Return is the end of the window in which an operation with an unknown
// result may have taken effect).
type opInput struct {
	Kind   string `json:"k"`
	Key    string `json:"key"`
	FP     string `json:"fp,omitempty"`
	Fence  uint64 `json:"f,omitempty"`
	Result string `json:"res,omitempty"`
	Lease  int64  `json:"l,omitempty"` // ms
	Ret    int64  `json:"ret,omitempty"`
	Max    int    `json:"m,omitempty"` // an acquisition's MaxAttempts
	Call   int64  `json:"-"`           // ms
	Return int64  `json:"-"`           // ms
	// LaxExpiry allows InProgress or Mismatch for a settled record at its
	// expiry.
	LaxExpiry bool `json:"-"`
	// LaxTakeover allows TakenOver where Acquired would be, and InProgress
	// or Mismatch where no claim was handed out (see
	// CampaignConfig.TakeoverOfMomentaryClaims).
	LaxTakeover bool `json:"-"`
	// SettleLease (ms): a complete or fail with an unknown result may have
	// extended the lease by this much (CampaignConfig.SettleExtendsLease).
	SettleLease int64 `json:"-"`
}

// Results of an operation.
const (
	resOK      = 0
	resStale   = 1 // ErrStaleFence: refused, nothing changed
	resUnknown = 2 // an error after which the operation may or may not have happened
	resAbsent  = 3 // ErrNotFound (Get)
)

type opOutput struct {
	Res        int           `json:"r"`
	Outcome    store.Outcome `json:"o,omitempty"`
	Fence      uint64        `json:"f,omitempty"`
	State      store.State   `json:"s,omitempty"`
	Result     string        `json:"res,omitempty"`
	FP         string        `json:"fp,omitempty"` // a Get's record's
	Attempts   int           `json:"a,omitempty"`
	LeaseUntil int64         `json:"lu,omitempty"` // ms
	ExpiresAt  int64         `json:"e,omitempty"`  // ms
}

// mstate is the record as the model knows it. Times the model cannot know
// exactly (set by a store operation somewhere in its call interval) are
// intervals.
type mstate struct {
	Exists     bool
	St         store.State
	Fence      uint64
	FenceKnown bool   // false after an acquisition whose answer was lost
	MaxFence   uint64 // the largest fence known to be issued for the key, ever
	FP         string
	Result     string
	Attempts   int // acquisitions that handed out a claim in this generation, less the claims given back by Unclaim
	LeaseLo    int64
	LeaseHi    int64
	ExpLo      int64
	ExpHi      int64
}

func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// The store's time t of the operation lies in [in.Call-slack, in.Return+slack].
func mayBeExpired(s mstate, in opInput) bool { return addSat(in.Return, slackMs) >= s.ExpLo }
func mayBeLive(s mstate, in opInput) bool    { return in.Call-slackMs < s.ExpHi }
func mustBeLive(s mstate, in opInput) bool   { return addSat(in.Return, slackMs) < s.ExpLo }
func leaseMayEnd(s mstate, in opInput) bool  { return addSat(in.Return, slackMs) >= s.LeaseLo }
func leaseMayLast(s mstate, in opInput) bool { return in.Call-slackMs < s.LeaseHi }

// settleMayHold reports whether an in-flight record may still be held past
// its lease and expiry by its owner's settle: a store that extends the
// lease before it settles (CampaignConfig.SettleExtendsLease, the tiered
// store) keeps the claim for up to SettleLease more while the settle runs,
// and the settle may then succeed. Only InProgress and Mismatch answers —
// answers that run nothing — get this slack.
func settleMayHold(s mstate, in opInput) bool {
	return in.SettleLease > 0 && s.Exists && s.St == store.StateInFlight &&
		in.Call-slackMs < addSat(max(s.LeaseHi, s.ExpHi), in.SettleLease)
}
func absentLike(s mstate, in opInput) bool  { return !s.Exists || mayBeExpired(s, in) }
func presentLike(s mstate, in opInput) bool { return s.Exists && mayBeLive(s, in) }
func owns(s mstate, f uint64) bool {
	return s.Exists && s.St == store.StateInFlight && s.FenceKnown && s.Fence == f
}
func settled(st store.State) bool             { return st == store.StateCompleted || st == store.StateFailed }
func interval(lo, hi, d int64) (int64, int64) { return lo + d, addSat(hi, d) }

// claimed is the state after an acquisition handed out a claim, the
// generation's attempts counted to attempts.
func claimed(s mstate, in opInput, out opOutput, attempts int) mstate {
	n := s
	n.Exists, n.St, n.FP, n.Result, n.Attempts = true, store.StateInFlight, in.FP, "", attempts
	if out.Res == resOK {
		n.Fence, n.FenceKnown, n.MaxFence = out.Fence, true, out.Fence
		// The answer's times are the store's; a composed store may report a
		// lower bound (the tiered store renews the claim before answering),
		// and no store sets them later than the answer's return allows.
		n.LeaseLo = out.LeaseUntil - slackMs
		n.LeaseHi = max(out.LeaseUntil, addSat(in.Return, in.Lease)) + slackMs
		n.ExpLo = out.ExpiresAt - slackMs
		n.ExpHi = max(out.ExpiresAt, addSat(in.Return, max(in.Lease, in.Ret))) + slackMs
		return n
	}
	n.Fence, n.FenceKnown = 0, false
	n.LeaseLo, n.LeaseHi = interval(in.Call, in.Return, in.Lease)
	n.ExpLo, n.ExpHi = interval(in.Call, in.Return, max(in.Lease, in.Ret))
	return n
}

// poisonDue: an acquisition that would run the work again (a released
// record, or a takeover) finds the generation's attempts at its
// MaxAttempts, and poisons the record instead.
func poisonDue(s mstate, in opInput) bool { return in.Max > 0 && s.Attempts >= in.Max }

// poisonMayBeDue is poisonDue, or (with TakeoverOfMomentaryClaims) any
// MaxAttempts: a momentary claim that was taken over counted an attempt
// that no answer shows, so the model's count is then a lower bound.
func poisonMayBeDue(s mstate, in opInput) bool {
	return poisonDue(s, in) || (in.LaxTakeover && in.Max > 0)
}

// attemptsMatch: an answer's attempts are the count the model expects (or,
// with TakeoverOfMomentaryClaims, more: see poisonMayBeDue).
func attemptsMatch(in opInput, out opOutput, want int) bool {
	return out.Attempts == want || (in.LaxTakeover && out.Attempts > want)
}

// rerunnable: the record is there, in this fingerprint, and an acquisition
// may hand out a claim on it (released, or in flight past its lease).
func rerunnable(s mstate, in opInput) bool {
	return presentLike(s, in) && s.FP == in.FP &&
		(s.St == store.StateReleased || (s.St == store.StateInFlight && leaseMayEnd(s, in)))
}

// poisoned is the state after an acquisition poisoned the record: no
// owner, a fence of its own (larger than the claim's, which the answer
// does not say), kept at least the request's retention (never shortened).
func poisoned(s mstate, in opInput) mstate {
	n := s
	n.St, n.LeaseLo, n.LeaseHi = store.StatePoisoned, 0, 0
	n.Fence, n.FenceKnown = 0, false
	lo, hi := interval(in.Call, in.Return, max(in.Lease, in.Ret))
	n.ExpLo, n.ExpHi = max(s.ExpLo, lo), max(s.ExpHi, hi)
	return n
}

// poisonedMomentary is the state after an acquisition poisoned another
// caller's momentary claim (one no answer shows) whose give-back came after
// its lease: a poisoned record of the request's fingerprint, its fence
// unknown, kept at least the request's retention and at most the momentary
// claim's, which the model does not know.
func poisonedMomentary(s mstate, in opInput) mstate {
	n := s
	n.Exists, n.St, n.FP, n.Result, n.Fence, n.FenceKnown = true, store.StatePoisoned, in.FP, "", 0, false
	n.LeaseLo, n.LeaseHi = 0, 0
	n.ExpLo = in.Call + max(in.Lease, in.Ret) - slackMs
	n.ExpHi = math.MaxInt64 / 2
	return n
}

// stepAcquire returns the states an acquisition can leave, given its answer.
func stepAcquire(s mstate, in opInput, out opOutput) []mstate {
	if out.Res == resUnknown {
		next := []mstate{s}
		// claim adds a claim counted to attempts and, for a store with
		// momentary claims (TakeoverOfMomentaryClaims), the same claim given
		// back before the error was reported (the tiered store does when
		// its cold tier fails: Unclaim, which takes the attempt back).
		claim := func(attempts int) {
			c := claimed(s, in, out, attempts)
			next = append(next, c)
			if in.LaxTakeover {
				r := c
				r.St, r.LeaseLo, r.LeaseHi, r.Attempts = store.StateReleased, 0, 0, attempts-1
				next = append(next, r)
			}
		}
		if absentLike(s, in) {
			claim(1)
		}
		if in.LaxTakeover && in.Max > 0 && momentaryClaimMayStand(s, in) {
			next = append(next, poisonedMomentary(s, in))
		}
		if rerunnable(s, in) {
			if poisonMayBeDue(s, in) {
				next = append(next, poisoned(s, in))
			}
			if !poisonDue(s, in) || in.LaxTakeover {
				// With momentary claims, an acquisition at MaxAttempts
				// takes the claim before it poisons (see
				// CampaignConfig.TakeoverOfMomentaryClaims).
				claim(s.Attempts + 1)
			}
		}
		return next
	}
	if out.Res != resOK {
		return nil
	}
	newFence := out.Fence > s.MaxFence
	rerun := rerunnable(s, in) && !poisonDue(s, in) && attemptsMatch(in, out, s.Attempts+1)
	switch out.Outcome {
	case store.Acquired:
		if newFence && absentLike(s, in) && attemptsMatch(in, out, 1) {
			return []mstate{claimed(s, in, out, out.Attempts)}
		}
		if newFence && rerun && s.St == store.StateReleased {
			return []mstate{claimed(s, in, out, out.Attempts)}
		}
	case store.TakenOver:
		if newFence && rerun && s.St == store.StateInFlight {
			return []mstate{claimed(s, in, out, out.Attempts)}
		}
		if in.LaxTakeover && newFence && ((absentLike(s, in) && attemptsMatch(in, out, 1)) || (rerun && s.St == store.StateReleased)) {
			return []mstate{claimed(s, in, out, out.Attempts)} // see CampaignConfig.TakeoverOfMomentaryClaims
		}
	case store.Poisoned:
		if presentLike(s, in) && s.FP == in.FP && s.St == store.StatePoisoned {
			return []mstate{s}
		}
		if rerunnable(s, in) && poisonMayBeDue(s, in) {
			return []mstate{poisoned(s, in)}
		}
		if in.LaxTakeover && in.Max > 0 && momentaryClaimMayStand(s, in) {
			return []mstate{poisonedMomentary(s, in)} // see CampaignConfig.TakeoverOfMomentaryClaims
		}
	case store.InProgress:
		if presentLike(s, in) && s.St == store.StateInFlight && s.FP == in.FP && leaseMayLast(s, in) {
			return []mstate{s}
		}
		if s.FP == in.FP && settleMayHold(s, in) {
			return []mstate{s}
		}
		if in.LaxExpiry && s.Exists && settled(s.St) && mayBeExpired(s, in) {
			return []mstate{s} // see CampaignConfig.InProgressAtExpiry
		}
		if in.LaxTakeover && momentaryClaimMayStand(s, in) {
			return []mstate{s} // see CampaignConfig.TakeoverOfMomentaryClaims
		}
		if in.LaxTakeover && momentaryTakeoverMayStand(s, in) {
			return []mstate{s} // see CampaignConfig.TakeoverOfMomentaryClaims
		}
	case store.Replayed:
		if presentLike(s, in) && settled(s.St) && s.FP == in.FP && out.State == s.St && out.Result == s.Result {
			return []mstate{s}
		}
	case store.Mismatch:
		if (presentLike(s, in) || settleMayHold(s, in)) && s.FP != in.FP {
			return []mstate{s}
		}
		if in.LaxExpiry && s.Exists && settled(s.St) && mayBeExpired(s, in) {
			return []mstate{s} // see CampaignConfig.InProgressAtExpiry
		}
		if in.LaxTakeover && momentaryClaimMayStand(s, in) {
			return []mstate{s} // see CampaignConfig.TakeoverOfMomentaryClaims
		}
	}
	return nil
}

// momentaryClaimMayStand: where no claim was handed out (the record absent
// or released), another caller's acquisition may hold a momentary claim
// that its answer never shows (the tiered store claims the hot tier while
// it asks the cold one, then answers the replay), and InProgress or
// Mismatch may come from it: answers that run nothing and change nothing.
func momentaryClaimMayStand(s mstate, in opInput) bool {
	return absentLike(s, in) || (presentLike(s, in) && s.St == store.StateReleased)
}

// momentaryTakeoverMayStand: where a claim in flight may have outlived its
// lease, another caller's acquisition may have taken it over for a moment
// (the tiered store's hot takeover while it asks the cold tier, ending in a
// poisoning at MaxAttempts, a replay, or a claim given back), and a caller
// of the same fingerprint may be told InProgress by it: an answer that runs
// nothing and changes nothing.
func momentaryTakeoverMayStand(s mstate, in opInput) bool {
	return presentLike(s, in) && s.St == store.StateInFlight && s.FP == in.FP && leaseMayEnd(s, in)
}

// stepOwned covers complete, fail, release, heartbeat, unclaim and poison
// claim.
func stepOwned(s mstate, in opInput, out opOutput) []mstate {
	applicable := owns(s, in.Fence) && mayBeLive(s, in)
	certain := owns(s, in.Fence) && mustBeLive(s, in)
	applied := s
	switch in.Kind {
	case opComplete, opFail:
		applied.St = store.StateCompleted
		if in.Kind == opFail {
			applied.St = store.StateFailed
		}
		applied.Result = in.Result
		applied.LeaseLo, applied.LeaseHi = 0, 0
		applied.ExpLo, applied.ExpHi = interval(in.Call, in.Return, in.Ret)
	case opRelease:
		applied.St = store.StateReleased
		applied.LeaseLo, applied.LeaseHi = 0, 0
	case opUnclaim: // a release that takes back the claim's attempt
		applied.St = store.StateReleased
		applied.LeaseLo, applied.LeaseHi = 0, 0
		applied.Attempts = max(s.Attempts-1, 0)
	case opPoison: // poisoned as at MaxAttempts, the claim's attempt taken back
		applied.St = store.StatePoisoned
		applied.LeaseLo, applied.LeaseHi = 0, 0
		applied.Attempts = max(s.Attempts-1, 0)
	case opHeartbeat:
		lo, hi := interval(in.Call, in.Return, in.Lease)
		applied.LeaseLo, applied.LeaseHi = lo, hi
		applied.ExpLo, applied.ExpHi = max(s.ExpLo, lo), max(s.ExpHi, hi)
	}
	switch out.Res {
	case resOK:
		if applicable {
			return []mstate{applied}
		}
	case resStale:
		if !certain {
			return []mstate{s}
		}
	case resUnknown:
		if !applicable {
			return []mstate{s}
		}
		if in.SettleLease > 0 && (in.Kind == opComplete || in.Kind == opFail) {
			// The settle extended the lease, then failed.
			ext := s
			ext.LeaseHi = max(s.LeaseHi, addSat(in.Return, in.SettleLease)+slackMs)
			ext.ExpHi = max(s.ExpHi, ext.LeaseHi)
			return []mstate{s, applied, ext}
		}
		return []mstate{s, applied}
	}
	return nil
}

// stepGet: a Get changes nothing; it answers the record as it is (state,
// fingerprint, result; fence and attempts where the model knows them), or
// ErrNotFound for a record absent or past its retention.
func stepGet(s mstate, in opInput, out opOutput) []mstate {
	switch out.Res {
	case resUnknown:
		return []mstate{s}
	case resAbsent:
		if absentLike(s, in) {
			return []mstate{s}
		}
	case resOK:
		if presentLike(s, in) && out.State == s.St && out.FP == s.FP && out.Result == s.Result &&
			(in.LaxTakeover || ((!s.FenceKnown || out.Fence == s.Fence) && out.Attempts == s.Attempts)) {
			// A composed store's settled record may carry the fence and
			// attempts of the claim that re-warmed it.
			return []mstate{s}
		}
		// A momentary claim, standing or given back (released, its
		// attempt taken back).
		momentary := out.State == store.StateInFlight || (out.State == store.StateReleased && out.Result == "")
		if momentary && in.LaxTakeover && momentaryClaimMayStand(s, in) {
			return []mstate{s} // see CampaignConfig.TakeoverOfMomentaryClaims
		}
		if momentary && in.LaxExpiry && s.Exists && settled(s.St) && mayBeExpired(s, in) {
			return []mstate{s} // see CampaignConfig.InProgressAtExpiry
		}
	}
	return nil
}

func step(state, input, output any) []any {
	s, in, out := state.(mstate), input.(opInput), output.(opOutput)
	var next []mstate
	switch in.Kind {
	case opAcquire:
		next = stepAcquire(s, in, out)
	case opGet:
		next = stepGet(s, in, out)
	case opDelete:
		gone := s
		gone.Exists = false
		next = []mstate{gone}
		if out.Res == resUnknown {
			next = append(next, s)
		}
	default:
		next = stepOwned(s, in, out)
	}
	res := make([]any, len(next))
	for i, n := range next {
		res[i] = n
	}
	return res
}

// recordModel is the sequential specification of the Store contract for one
// key, partitioned by key.
var recordModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range h {
			k := op.Input.(opInput).Key
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, byKey[k])
		}
		return out
	},
	Init:  func() []any { return []any{mstate{}} },
	Step:  step,
	Equal: func(a, b any) bool { return a.(mstate) == b.(mstate) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(opInput), output.(opOutput)
		return fmt.Sprintf("%s(%s fp=%s f=%d lease=%d ret=%d max=%d) -> res=%d %v %v fp=%s f=%d %q attempts=%d lease_until=%d expires=%d", in.Kind, in.Key, in.FP, in.Fence, in.Lease, in.Ret, in.Max,
			out.Res, out.Outcome, out.State, out.FP, out.Fence, out.Result, out.Attempts, out.LeaseUntil, out.ExpiresAt)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("%+v", state.(mstate)) },
}
