package tieredstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/internal/ctxsleep"
	"github.com/idemgo/idem/store"
)

var _ store.Store = (*Store)(nil)

// Config configures a Store.
type Config struct {
	// Hot takes the claims. Required.
	Hot store.Store
	// Cold keeps settled records for their full retention. Required; it
	// must implement store.Archiver (memstore, sqlitestore and pgstore do).
	Cold store.Store
	// HotRetention caps how long a record stays in the hot store. Defaults
	// to 1h.
	HotRetention time.Duration
	// SettleTimeout bounds the cold archive of a Complete or Fail. Before
	// archiving, the settle extends the owner's hot lease to at least this
	// long (a fenced heartbeat), so no takeover can happen while the
	// archive is in flight, and the archive is given half of it. Defaults
	// to 10s.
	SettleTimeout time.Duration
}

// Store is a tiered store.Store.
//
// Claims, leases and fences live in the hot tier. Every claim the hot tier
// hands out (Acquired or TakenOver, first run or not) is checked against the
// cold tier before it is returned, and so is every InProgress, Mismatch and
// Poisoned answer (the hot record may be a momentary claim, or one poisoned
// at MaxAttempts, of a key settled in the cold tier): a settled record
// there is replayed, and a
// cold tier that cannot answer — within half the request's lease — fails
// the acquisition closed (the hot claim is given back, its attempt
// uncounted if the give-back lands within the lease; a claim taken over
// before it counts the attempt, see the README). A completion or definite failure is written to the cold
// tier first — with the owner's fence, after checking it and extending its
// lease in the hot tier, so no takeover can meet the archive in flight —
// and then settled in the hot tier: when Complete returns nil the result is
// durable for the full retention (unless the key is deleted: a Delete that
// lands after the archive leaves the settle in effect, ordered before it),
// and an owner killed between the two
// writes leaves a hot claim whose takeover finds the result in the cold
// tier. Unsettled records (in flight, released, poisoned) keep the full
// retention in the hot tier; settled ones stay there for HotRetention.
type Store struct {
	hot, cold     store.Store
	archive       store.Archiver
	hotKeep       time.Duration
	settleTimeout time.Duration

	afterArchive     func() // test hook: between the two writes of a settle
	beforeArchive    func() // test hook: after the settle's lease check
	duringDelete     func() // test hook: between Delete's tombstone and its hot removal
	afterDeleteReads func() // test hook: after Delete read both tiers
	afterColdSettled func() // test hook: in Acquire, after the cold read found a settled record
	awaitingClaim    func() // test hook: a refused settle waits on another claim in flight
	deleteLockHeld   func() // test hook: a Delete found its key's delete lock held
}

// New validates cfg and returns a Store. Close closes both tiers.
func New(cfg Config) (*Store, error) {
	if cfg.Hot == nil || cfg.Cold == nil {
		return nil, errors.New("idem/tieredstore: Config.Hot and Config.Cold are required")
	}
	a, ok := cfg.Cold.(store.Archiver)
	if !ok {
		return nil, fmt.Errorf("idem/tieredstore: Config.Cold (%T) cannot archive records", cfg.Cold)
	}
	if cfg.HotRetention < 0 {
		return nil, errors.New("idem/tieredstore: Config.HotRetention must not be negative")
	}
	if cfg.SettleTimeout < 0 {
		return nil, errors.New("idem/tieredstore: Config.SettleTimeout must not be negative")
	}
	if cfg.SettleTimeout == 0 {
		cfg.SettleTimeout = 10 * time.Second
	}
	if cfg.HotRetention == 0 {
		cfg.HotRetention = time.Hour
	}
	return &Store{hot: cfg.Hot, cold: cfg.Cold, archive: a, hotKeep: cfg.HotRetention, settleTimeout: cfg.SettleTimeout}, nil
}

func (s *Store) hotRetention(d time.Duration) time.Duration { return min(d, s.hotKeep) }

// rewarmMargin is how much earlier than the cold record a re-warmed hot
// copy expires: more than the time between counting its retention and the
// hot store applying it, so that the copy never outlives the record. A
// re-warm whose write took longer drops the copy it wrote.
const rewarmMargin = 100 * time.Millisecond

// Acquire implements store.Store. A claim from the hot tier is returned only
// after the cold tier said it holds no settled record for the key.
func (s *Store) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	if err := (store.Limits{}).CheckRetention(req.Retention); err != nil {
		return store.Acquisition{}, err
	}
	// The hot tier is asked without MaxAttempts: a key settled in the cold
	// tier may have counted attempts in the hot tier under momentary claims
	// (of callers that died before giving them back), and a poisoning there
	// would shadow the settled record — seen by other callers, and left
	// behind once the cold record expires. A claim past MaxAttempts is
	// checked against the cold tier like any other, and poisons the key
	// only when the key is not settled there (see poison).
	uncapped := req
	uncapped.MaxAttempts = 0
	a, err := s.hot.Acquire(ctx, uncapped) // unsettled records keep the full retention
	if err != nil {
		return a, err
	}
	return s.answer(ctx, req, a)
}

// answer returns the acquisition for the hot tier's answer a, after
// consulting the cold tier.
func (s *Store) answer(ctx context.Context, req store.AcquireRequest, a store.Acquisition) (store.Acquisition, error) {
	if a.Outcome == store.InProgress || a.Outcome == store.Mismatch || a.Outcome == store.Poisoned {
		// The hot record may be another caller's momentary claim on a key
		// that the cold tier holds settled (taken to consult the cold tier
		// or to re-warm the hot one): the settled record is the answer.
		// Poisoned too: such a claim, held past its lease by a paused
		// caller, counts an attempt, and an acquisition at MaxAttempts
		// poisons it in the hot tier — a key that ran and completed.
		// If the cold tier cannot say, neither can we: fail closed.
		// Poisoned is a decision (the message is dead-lettered), like a
		// claim: it waits for an archive of the key under way, whose
		// owner's claim was the last attempt (see coldReadAwaiting).
		var rec store.Record
		var err error
		if a.Outcome == store.Poisoned {
			rec, err = s.coldReadAwaiting(ctx, req)
		} else {
			rec, err = s.cold.Get(ctx, req.Key)
		}
		if err == nil && rec.State == store.StateReleased && (rec.Fence >= a.Record.Fence || deleting(rec)) {
			// A Delete's tombstone covers the hot record's generation: the
			// Delete is under way and removes the hot copy next (which may
			// be a duplicate's momentary claim, with no work under it).
			// Neither InProgress nor the settled record is the answer.
			return store.Acquisition{}, errBeingDeleted
		}
		if errors.Is(err, store.ErrNotFound) || (err == nil && rec.State != store.StateCompleted && rec.State != store.StateFailed) {
			return a, nil
		}
		if err != nil {
			return store.Acquisition{}, fmt.Errorf("cold tier: %w", err)
		}
		if a.Outcome == store.Poisoned {
			// The poisoned copy would shadow the settled record: drop it
			// (and nothing newer), so the next request re-warms the hot
			// tier from the cold one.
			_ = s.dropClaim(context.WithoutCancel(ctx), req.Key, a.Record.Fence)
		}
		if rec.Fingerprint != req.Fingerprint {
			return store.Acquisition{Outcome: store.Mismatch, Record: rec}, nil
		}
		return store.Acquisition{Outcome: store.Replayed, Record: rec}, nil
	}
	if !a.Outcome.Owns() {
		return a, nil
	}
	rec, err := s.coldReadAwaiting(ctx, req)
	if err == nil && deleting(rec) {
		// A Delete is between its tombstone and its hot removal, which may
		// remove this claim too: it is not a claim to hand out.
		_ = s.giveBack(context.WithoutCancel(ctx), req.Key, a.Fence)
		return store.Acquisition{}, errBeingDeleted
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && rec.State != store.StateCompleted && rec.State != store.StateFailed) {
		if req.MaxAttempts > 0 && a.Record.Attempts > req.MaxAttempts {
			return s.poison(ctx, req, a)
		}
		// The claim must still stand after the cold round trip: a Delete
		// that ran meanwhile removed it (and the cold record we did not
		// see). A fenced heartbeat checks it and renews the lease.
		start := time.Now()
		if err := s.hot.Heartbeat(ctx, req.Key, a.Fence, req.Lease); err != nil {
			if errors.Is(err, store.ErrStaleFence) {
				// Deleted, or taken over by another caller while this one
				// was paused past its lease: the claim is not ours.
				return store.Acquisition{}, fmt.Errorf("%w: idem/tieredstore: the claim was deleted or taken over while the cold tier was consulted; retry", store.ErrUnavailable)
			}
			_ = s.giveBack(context.WithoutCancel(ctx), req.Key, a.Fence)
			return store.Acquisition{}, err
		}
		a.Record.LeaseUntil = start.Add(req.Lease) // no later than the store's
		return a, nil
	}
	bg := context.WithoutCancel(ctx)
	if err != nil {
		// Fail closed: give the claim back and report the cold tier's
		// failure. The next claim asks the cold tier again.
		_ = s.giveBack(bg, req.Key, a.Fence)
		return store.Acquisition{}, fmt.Errorf("cold tier: %w", err)
	}
	if s.afterColdSettled != nil {
		s.afterColdSettled()
	}
	if rec.Fingerprint != req.Fingerprint {
		// The hot record was made by this mismatching request: drop it so
		// it does not shadow the archived fingerprint (nor outlive the
		// archive, holding the key for this fingerprint).
		_ = s.dropClaim(bg, req.Key, a.Fence)
		return store.Acquisition{Outcome: store.Mismatch, Record: rec}, nil
	}
	// Re-warm the hot tier with the archived result. The hot copy must
	// not outlive the cold record (a replay past the retention), and its
	// retention is counted when the hot write runs, a moment after this
	// one: it ends rewarmMargin early, and a record about to expire is not
	// re-warmed at all (the next duplicate asks the cold tier again).
	counted, left := time.Now(), time.Until(rec.ExpiresAt)
	keep := s.hotRetention(left - rewarmMargin)
	if keep < time.Millisecond {
		err = s.giveBack(bg, req.Key, a.Fence)
	} else if rec.State == store.StateFailed {
		err = s.hot.Fail(bg, req.Key, a.Fence, rec.Result, keep)
	} else {
		err = s.hot.Complete(bg, req.Key, a.Fence, rec.Result, keep)
	}
	switch {
	case err != nil:
		_ = s.giveBack(bg, req.Key, a.Fence)
	case keep >= time.Millisecond && time.Since(counted) > left-keep:
		// The write took longer than its slack (the cold record's time
		// left less the copy's retention; a stalled connection): the hot
		// store may have counted the retention late enough for the copy to
		// outlive the cold record. Drop the copy; the next request reads
		// the cold tier again.
		_ = s.dropClaim(bg, req.Key, a.Fence)
	}
	return store.Acquisition{Outcome: store.Replayed, Record: rec}, nil
}

// poison ends the claim a that went past req.MaxAttempts on a key the cold
// tier does not hold settled, by poisoning the key in the hot tier: in one
// step where the hot store can (store.Unclaimer's PoisonClaim). If the claim
// was taken over or deleted while the cold tier was consulted, the
// acquisition fails as unavailable.
//
// On another hot store the claim is given back and the key acquired again
// under MaxAttempts, which poisons it; for that moment the key is released,
// and a caller that claims it then (one without a MaxAttempts, or with a
// larger one) keeps it, and this acquisition fails as unavailable: its own
// claim came and went unseen, so it is not told InProgress as if it had
// found that caller's claim first.
func (s *Store) poison(ctx context.Context, req store.AcquireRequest, a store.Acquisition) (store.Acquisition, error) {
	bg := context.WithoutCancel(ctx)
	if u, ok := s.hot.(store.Unclaimer); ok {
		err := u.PoisonClaim(bg, req.Key, a.Fence)
		if errors.Is(err, store.ErrStaleFence) {
			return store.Acquisition{}, fmt.Errorf("%w: idem/tieredstore: the claim was deleted or taken over while the cold tier was consulted; retry", store.ErrUnavailable)
		}
		if err != nil {
			_ = s.giveBack(bg, req.Key, a.Fence)
			return store.Acquisition{}, err
		}
		rec := a.Record
		rec.State, rec.LeaseUntil = store.StatePoisoned, time.Time{}
		rec.Attempts = max(rec.Attempts-1, 0)
		return store.Acquisition{Outcome: store.Poisoned, Record: rec}, nil
	}
	if err := s.hot.Release(bg, req.Key, a.Fence); err != nil {
		return store.Acquisition{}, err
	}
	a, err := s.hot.Acquire(ctx, req)
	if err != nil {
		return a, err
	}
	if a.Outcome == store.InProgress || a.Outcome == store.Mismatch {
		return store.Acquisition{}, fmt.Errorf("%w: idem/tieredstore: the key was claimed by another caller while this one poisoned it at MaxAttempts; retry", store.ErrUnavailable)
	}
	return s.answer(ctx, req, a) // a claim now is within MaxAttempts
}

// coldReadAwaiting reads the cold tier before a claim is handed out (or a
// key answered Poisoned): waiting for the archives of the key under way
// (store.ArchiveAwaiter), for at most half the request's lease. A claim held
// meanwhile is momentary until the cold tier answers — nothing runs under
// it — and a read that outlasted the lease let another request take it
// over, counting an attempt for a claim under which nothing ran (a key
// poisoned early). Past the bound the read fails (ErrStoreUnavailable),
// and the caller gives the claim back with its attempt before its lease
// ends.
func (s *Store) coldReadAwaiting(ctx context.Context, req store.AcquireRequest) (store.Record, error) {
	bound := req.Lease / 2
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var rec store.Record
	var err error
	if a, ok := s.cold.(store.ArchiveAwaiter); ok {
		// An archive of an owner whose lease ended may be under way still
		// (its caller told it failed): wait for it, so that it does not
		// land beside the claim, or after the Poisoned answer.
		rec, err = a.GetAwaitingArchives(cctx, req.Key)
	} else {
		rec, err = s.cold.Get(cctx, req.Key)
	}
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		err = fmt.Errorf("%w: idem/tieredstore: the cold tier did not answer within half the lease (%v)", store.ErrUnavailable, bound)
	}
	return rec, err
}

// giveBack returns a hot claim under which nothing ran (the acquisition
// failed closed, or the claim was momentary: taken to consult the cold
// tier). Where the hot store can (store.Unclaimer), the claim's attempt is
// taken back too, so that a cold-tier outage does not count toward
// MaxAttempts and poison a key whose work never ran.
func (s *Store) giveBack(ctx context.Context, key string, fence uint64) error {
	if u, ok := s.hot.(store.Unclaimer); ok {
		return u.Unclaim(ctx, key, fence)
	}
	return s.hot.Release(ctx, key, fence)
}

// dropClaim removes the hot record of this caller's claim (fence), and
// nothing newer: if the caller was paused past its lease, another
// request may have taken the claim over and, the cold record having
// expired since, own the key — an unconditional removal took that owner's
// claim away, and the next request was handed a second one. A hot store
// that cannot delete up to a fence (not store.FencedDeleter; every store of
// this module can) has its record deleted whole.
func (s *Store) dropClaim(ctx context.Context, key string, fence uint64) error {
	if d, ok := s.hot.(store.FencedDeleter); ok {
		return d.DeleteUpTo(ctx, key, fence)
	}
	return s.hot.Delete(ctx, key)
}

// Heartbeat implements store.Store (hot tier).
func (s *Store) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	return s.hot.Heartbeat(ctx, key, fence, lease)
}

// Release implements store.Store (hot tier).
func (s *Store) Release(ctx context.Context, key string, fence uint64) error {
	return s.hot.Release(ctx, key, fence)
}

// Complete implements store.Store: archive in the cold tier, then settle in
// the hot tier (fenced). A Complete that finds its claim gone from the hot
// tier answers nil when the cold tier holds this very settle under its
// fence — an earlier try landed and its answer was lost, and the hot copy
// expired or was re-warmed since (under another fence): a repeat with the
// same result succeeds, as a retry must; with another result it is
// ErrStaleFence.
func (s *Store) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, key, fence, result, retention, s.hot.Complete, store.StateCompleted)
}

// Fail implements store.Store like Complete.
func (s *Store) Fail(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, key, fence, result, retention, s.hot.Fail, store.StateFailed)
}

type settleFunc func(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error

func (s *Store) settle(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration, hot settleFunc, st store.State) error {
	if err := (store.Limits{}).CheckRetention(retention); err != nil {
		return err
	}
	cur, err := s.hot.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (cur.State == store.StateCompleted || cur.State == store.StateFailed) && cur.Fence != fence) {
		return s.staleUnlessLanded(ctx, key, fence, st, result)
	}
	if err == nil && (cur.State != store.StateInFlight || cur.Fence != fence) {
		return store.ErrStaleFence
	}
	if err != nil {
		return err
	}
	// The archive must land while the claim is still ours: once the lease
	// ended, a takeover could claim the key and the cold tier would then
	// hold the result of a settle the hot tier refuses. A fenced heartbeat
	// keeps the lease for at least SettleTimeout (never shortening it) and
	// the archive gets half of that, counted from before the heartbeat was
	// sent: the lease runs from when the hot tier applied it, and its answer
	// may come back late (TestArchiveBudgetCountsFromBeforeTheHeartbeat).
	sent := time.Now()
	if err := s.hot.Heartbeat(ctx, key, fence, max(s.settleTimeout, time.Until(cur.LeaseUntil))); err != nil {
		return err
	}
	if s.beforeArchive != nil {
		s.beforeArchive()
	}
	rec := store.Record{Key: key, State: st, Fence: fence, Fingerprint: cur.Fingerprint, Attempts: cur.Attempts, Result: result}
	actx, cancel := context.WithDeadline(ctx, sent.Add(s.settleTimeout/2))
	stored := true // what an Archiver that does not say is taken to have done
	if sa, ok := s.archive.(store.StoredArchiver); ok {
		stored, err = sa.ArchiveStored(actx, rec, retention)
	} else {
		err = s.archive.Archive(actx, rec, retention)
	}
	cancel()
	if err != nil {
		return fmt.Errorf("idem/tieredstore: not settled, the cold tier refused the archive: %w", err)
	}
	if s.afterArchive != nil {
		s.afterArchive()
	}
	// The result is durable now. If the hot settle fails, the hot claim
	// stays until its lease ends and the takeover replays from the cold tier.
	err = hot(context.WithoutCancel(ctx), key, fence, result, s.hotRetention(retention))
	if errors.Is(err, store.ErrStaleFence) {
		return s.settleRefused(context.WithoutCancel(ctx), rec, stored, err)
	}
	return err
}

// staleUnlessLanded answers a settle that finds no record in the hot tier,
// or one settled under another fence: ErrStaleFence, unless this very
// settle is in effect — an earlier try of it landed in both tiers (its
// answer lost), and the hot copy has since expired, or been re-warmed from
// the archive under a duplicate's claim: the archive, under this fence with
// this state and result, is the record, and a retry must not report as
// lost a completion duplicates are replayed. (A claim of another fence in
// flight is not such a case: the settle is refused.) A cold tier that
// cannot say fails the settle as unavailable (tried again).
func (s *Store) staleUnlessLanded(ctx context.Context, key string, fence uint64, st store.State, result []byte) error {
	archived, err := s.cold.Get(ctx, key)
	switch {
	case err == nil && archived.Fence == fence && archived.State == st && bytes.Equal(archived.Result, result):
		return nil
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: idem/tieredstore: the claim is gone from the hot tier and the cold tier could not say whether this settle landed: %v", store.ErrUnavailable, err)
	}
	return store.ErrStaleFence
}

// ErrSettleUncertain is returned by Complete and Fail when the owner's claim
// ended between its cold archive and its hot settle while the archive stood
// beside another owner's claim: duplicates may have been replayed the result
// before it was withdrawn, and the key is now the other owner's; or when
// the hot tier, failed over to a replica that lagged, holds an older claim
// instead, whose owner may still settle: the archive then stands. Neither
// "settled" nor "refused, nothing changed" (ErrStaleFence) is true. It
// happens only when the owner stalls for longer than SettleTimeout inside
// the settle, or when the hot tier loses the owner's claim (a restart, a
// failover) while it settles.
var ErrSettleUncertain = errors.New("idem/tieredstore: settle outcome uncertain: the claim was lost after the result was archived, and duplicates may have been replayed it")

// settleRefused decides what a settle whose archive is done (stored: it
// took the cold record) and whose hot settle was refused (staleErr) means.
// The owner stalled longer than the lease extension (CPU starvation, a long
// pause), or the key was deleted meanwhile. The answer follows from what
// duplicates may have seen:
//   - the hot tier holds the settled result (a duplicate found the archive
//     and re-warmed the hot tier with it): the settle is in effect;
//   - the archive was kept out (a Delete's tombstone came first): nothing
//     was visible, the settle is refused (and an earlier try's archive
//     under the same fence withdrawn, as before);
//   - the archive was stored and is gone from the cold tier now (a Delete
//     after it, perhaps followed by a new generation's claim), or the hot
//     tier holds no record at all, or one that no owner holds (released or
//     poisoned: a duplicate's momentary claim given back after its re-warm
//     failed, say; every claim of the hot tier meets the cold record first):
//     the cold record is the record, the result was visible, the settle
//     took effect;
//   - the hot tier holds a claim in flight older than the owner's: the hot
//     tier went back (a failover to a replica that lagged), and that
//     claim's owner may be working still; the archive, under the larger
//     fence, stands, and the owner is told ErrSettleUncertain;
//   - the archive still stands beside another owner's hot claim (a takeover
//     while the owner stalled), or the tiers cannot tell: the archive is
//     withdrawn with a tombstone of its fence, so that the other owner's
//     work decides, and the owner is told ErrSettleUncertain. A claim in
//     flight is first given its lease to show whether it is a duplicate's
//     momentary one (awaitClaim).
func (s *Store) settleRefused(ctx context.Context, rec store.Record, stored bool, staleErr error) error {
	now, herr := s.hot.Get(ctx, rec.Key)
	if herr == nil && now.State == store.StateInFlight && now.Fence < rec.Fence {
		// A claim older than this settle's own: no takeover made after it,
		// but the hot tier gone back (a failover to a replica that lagged),
		// and that claim's owner possibly still working. The archive, under
		// the larger fence, stands: withdrawing it would keep that owner's
		// archive out too, and its hot settle would then succeed with
		// nothing in the cold tier.
		return ErrSettleUncertain
	}
	if herr == nil && now.State == store.StateInFlight && now.Fence != rec.Fence {
		now, herr = s.awaitClaim(ctx, now)
	}
	if herr == nil && sameSettle(now, rec) {
		return nil
	}
	if !stored {
		// Kept out: what the cold tier holds under this fence, if
		// anything, is an earlier try's archive (a Complete retried after an
		// error), which the owner's refusal withdraws as well.
		return s.withdraw(ctx, rec, staleErr)
	}
	if herr != nil && !errors.Is(herr, store.ErrNotFound) {
		return s.withdraw(ctx, rec, fmt.Errorf("%w (the hot tier could not be read: %v)", ErrSettleUncertain, herr))
	}
	archived, cerr := s.cold.Get(ctx, rec.Key)
	switch {
	case cerr != nil && !errors.Is(cerr, store.ErrNotFound):
		return s.withdraw(ctx, rec, fmt.Errorf("%w (the cold tier could not be read: %v)", ErrSettleUncertain, cerr))
	case cerr == nil && archived.Fence == rec.Fence && sameSettle(archived, rec):
		if errors.Is(herr, store.ErrNotFound) {
			return nil // the hot record went (deleted or expired); the archive stands alone
		}
		if now.State == store.StateReleased || now.State == store.StatePoisoned {
			// No owner holds the key — a duplicate's momentary claim given
			// back (its re-warm failed), say — and every claim of the hot
			// tier meets the archive first: the archive is the record.
			return nil
		}
		return s.withdraw(ctx, rec, ErrSettleUncertain)
	case cerr == nil && archived.State != store.StateReleased:
		// A larger fence's settle replaced the archive: another owner took
		// the key over and settled it after this result was visible.
		return ErrSettleUncertain
	}
	return nil // deleted after the archive made the result visible
}

// awaitClaim waits for a claim in flight in the hot tier (claim) beside a
// refused settle's archive to show what it is: a duplicate's momentary
// claim, consulting the cold tier, re-warms the hot tier with the archive
// or gives the claim back within its lease; an owner's claim, taken before
// the archive landed, is extended by its heartbeats. It returns the hot
// record once it is no longer that claim in flight at that lease, or as it
// stands when the claim's lease (at most SettleTimeout) has passed on this
// process's clock.
func (s *Store) awaitClaim(ctx context.Context, claim store.Record) (store.Record, error) {
	if s.awaitingClaim != nil {
		s.awaitingClaim()
	}
	lease := claim.LeaseUntil.Sub(claim.UpdatedAt) // the hot tier's clock: a duration
	deadline := time.Now().Add(min(max(lease, 0), s.settleTimeout))
	now, err := claim, error(nil)
	ctxsleep.Retry(ctx, func() time.Time { return deadline }, func() bool {
		now, err = s.hot.Get(ctx, claim.Key)
		return err == nil && now.State == store.StateInFlight && now.Fence == claim.Fence && !now.LeaseUntil.After(claim.LeaseUntil)
	})
	return now, err
}

// sameSettle reports whether r is the record that settle rec wrote.
func sameSettle(r, rec store.Record) bool {
	return r.State == rec.State && r.Fingerprint == rec.Fingerprint && bytes.Equal(r.Result, rec.Result)
}

// withdraw replaces rec's archive with a tombstone of its fence (a newer
// owner's archive, with a larger fence, stays) and returns err, or the
// failure to withdraw.
func (s *Store) withdraw(ctx context.Context, rec store.Record, err error) error {
	// A tombstone there already covers the archive — a Delete's, perhaps
	// still marked as under way, which this one must not replace.
	if c, cerr := s.cold.Get(ctx, rec.Key); cerr != nil || c.State != store.StateReleased || c.Fence < rec.Fence {
		tomb := store.Record{Key: rec.Key, State: store.StateReleased, Fence: rec.Fence}
		if terr := s.archive.Archive(ctx, tomb, s.settleTimeout); terr != nil {
			return fmt.Errorf("%w (and withdrawing its archive failed: %v)", err, terr)
		}
	}
	// A duplicate that read the archive before the tombstone may have
	// re-warmed the hot tier with it since: remove that copy too (the cold
	// tier answers for the key; a newer owner's archive stays).
	if now, gerr := s.hot.Get(ctx, rec.Key); gerr == nil && sameSettle(now, rec) {
		_ = s.dropClaim(ctx, rec.Key, now.Fence) // that copy only, not a claim made since
	}
	return err
}

// Get implements store.Store: the hot tier, then the cold one. A hot record
// that is not settled (in flight, released or poisoned) may be a momentary
// claim, one given back or one poisoned — taken to consult the cold tier,
// or by a request of another fingerprint — on a key that the cold tier
// holds settled (see Acquire); the settled record is then the answer, as
// Acquire would replay it, and a cold tier that cannot say fails the Get.
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	rec, err := s.hot.Get(ctx, key)
	if err == nil && rec.State != store.StateInFlight && rec.State != store.StateReleased && rec.State != store.StatePoisoned {
		return rec, nil
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return rec, err
	}
	c, cerr := s.cold.Get(ctx, key)
	switch {
	case cerr == nil && (c.State == store.StateCompleted || c.State == store.StateFailed):
		return c, nil
	case cerr != nil && !errors.Is(cerr, store.ErrNotFound):
		return store.Record{}, fmt.Errorf("cold tier: %w", cerr)
	case err == nil: // the hot record stands
		return rec, nil
	}
	return store.Record{}, store.ErrNotFound // nothing, or a Delete's tombstone
}

// Delete implements store.Store: the cold tier first, then the hot one, so
// that a claim taken meanwhile cannot re-warm the hot tier from a cold
// record that is about to go.
//
// An owner may be settling: its archive, already past the hot check, could
// land in the cold tier after a plain delete there and bring the record
// back. So the cold record is replaced by a tombstone carrying the largest
// fence either tier holds for the key (every settle in flight holds that
// fence or an older one), which keeps those archives out for as long as a
// settle may take (SettleTimeout); the next generation's fences are larger.
//
// The tombstone also covers a claim taken between the Delete's reads and
// the tombstone (the hot tier is read again after it), which the hot
// removal takes too, so that claim's archive cannot land after it.
//
// Until the hot record is removed, the tombstone is marked as a Delete
// under way: a request that claims the key meanwhile is told to retry
// (ErrStoreUnavailable) instead of being handed a claim that the hot
// removal would take away — the next request would be handed a second one.
// Once the hot record is gone the mark is cleared and the key is new. A
// Delete that stops half-way leaves the key closed to new claims until its
// tombstone expires (SettleTimeout).
//
// Deletes of one key run one at a time: a Delete first claims the key's
// delete lock in the hot tier (a record of its own, see deleteLockKey) and
// waits while another Delete holds it. Two at once could otherwise clear
// each other's mark early, and the second one's hot removal take away a
// claim made after the first one ended — and the hot removal must be
// unconditional, as it also takes the claim of a request that read the
// cold record before the tombstone and is about to re-warm the hot tier
// with it. The lock's lease is SettleTimeout: a Delete that stalls longer
// may overlap the next one.
func (s *Store) Delete(ctx context.Context, key string) error {
	unlock, err := s.lockDelete(ctx, key)
	if err != nil {
		return err
	}
	defer unlock()
	var fence uint64
	found := false
	for _, tier := range []store.Store{s.hot, s.cold} {
		rec, err := tier.Get(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		fence, found = max(fence, rec.Fence), true
	}
	if s.afterDeleteReads != nil {
		s.afterDeleteReads()
	}
	if !found {
		// Nothing to delete. (Removing the hot key now could remove a claim
		// taken since the reads above: the key's next generation.)
		return nil
	}
	tomb := store.Record{Key: key, State: store.StateReleased, Fence: fence, Result: []byte(deletingMark)}
	if err := s.archive.Archive(ctx, tomb, s.settleTimeout); err != nil {
		return err
	}
	// A claim taken since the reads above, whose cold read came before the
	// mark, is in the hot tier now, and the hot removal below takes it: the
	// tombstone must cover its fence too, or its owner's archive could land
	// after the tombstone and bring that generation back after the Delete.
	// Claims taken from here on meet the mark.
	switch rec, err := s.hot.Get(ctx, key); {
	case err == nil && rec.Fence > tomb.Fence:
		tomb.Fence = rec.Fence
		if err := s.archive.Archive(ctx, tomb, s.settleTimeout); err != nil {
			return err
		}
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return err
	}
	if s.duringDelete != nil {
		s.duringDelete()
	}
	if err := s.hot.Delete(ctx, key); err != nil {
		return err
	}
	// The hot tier holds nothing of the deleted generation now: claims from
	// here on are the key's next one.
	tomb.Result = nil
	if err := s.archive.Archive(ctx, tomb, s.settleTimeout); err != nil {
		return fmt.Errorf("idem/tieredstore: the key is deleted, but it stays closed to new claims until its tombstone expires (%v): %w", s.settleTimeout, err)
	}
	return nil
}

// lockDelete claims the delete lock of key in the hot tier, waiting (until
// ctx ends) while another Delete holds it, and returns its release.
func (s *Store) lockDelete(ctx context.Context, key string) (unlock func(), err error) {
	req := store.AcquireRequest{Key: deleteLockKey(key), Fingerprint: "delete", Lease: s.settleTimeout, Retention: s.settleTimeout}
	wait := time.Millisecond
	for {
		a, err := s.hot.Acquire(ctx, req)
		if err != nil {
			return nil, err
		}
		if a.Outcome.Owns() {
			return func() { _ = s.giveBack(context.WithoutCancel(ctx), req.Key, a.Fence) }, nil
		}
		if a.Outcome != store.InProgress {
			return nil, fmt.Errorf("idem/tieredstore: the delete lock of the key, %q in the hot tier, holds a record of another kind (%v)", req.Key, a.Outcome)
		}
		if s.deleteLockHeld != nil {
			s.deleteLockHeld()
		}
		if err := ctxsleep.Sleep(ctx, wait); err != nil {
			return nil, err
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// deleteLockKey is the hot-tier key of key's delete lock: "d~" and the
// base64url SHA-256/128 of key, a form no key made by idem.Key.Storage
// takes (a raw key holds the scope separator, a compact one starts "1~").
func deleteLockKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "d~" + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// deletingMark is the result of a Delete's tombstone until the Delete has
// removed the hot record: an acquisition that meets it must not hand out a
// claim, which the hot removal could take away. A tombstone of an earlier
// release (no result) counts as a finished Delete.
const deletingMark = "idem/tieredstore: delete under way"

// errBeingDeleted answers an acquisition that met a Delete under way.
var errBeingDeleted = fmt.Errorf("%w: idem/tieredstore: the key is being deleted; retry", store.ErrUnavailable)

// deleting reports whether rec is the tombstone of a Delete under way.
func deleting(rec store.Record) bool {
	return rec.State == store.StateReleased && string(rec.Result) == deletingMark
}

// Sweep implements store.Store: both tiers. It returns the larger of the two
// counts, as each settled record lives in both.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	nh, errH := s.hot.Sweep(ctx, limit)
	nc, errC := s.cold.Sweep(ctx, limit)
	return max(nh, nc), errors.Join(errH, errC)
}

// Close closes both tiers.
func (s *Store) Close() error {
	return errors.Join(s.hot.Close(), s.cold.Close())
}

// ServerWarnings gives what the tiers' stores say is off in their servers'
// settings (redisstore.Store.ServerWarnings, pgstore.Store.ServerWarnings),
// each prefixed with its tier; a tier whose store has no such method says
// nothing. A tier that cannot read its settings yields its error, joined,
// beside the other tier's warnings.
func (s *Store) ServerWarnings(ctx context.Context) ([]string, error) {
	var warnings []string
	var errs []error
	for _, tier := range []struct {
		name  string
		store store.Store
	}{{"hot tier", s.hot}, {"cold tier", s.cold}} {
		w, ok := tier.store.(interface {
			ServerWarnings(context.Context) ([]string, error)
		})
		if !ok {
			continue
		}
		found, err := w.ServerWarnings(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", tier.name, err))
		}
		for _, f := range found {
			warnings = append(warnings, tier.name+": "+f)
		}
	}
	return warnings, errors.Join(errs...)
}
