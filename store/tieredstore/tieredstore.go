package tieredstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem"
)

var _ idem.Store = (*Store)(nil)

// Config configures a Store.
type Config struct {
	// Hot takes the claims. Required.
	Hot idem.Store
	// Cold keeps settled records for their full retention. Required; it
	// must implement idem.Archiver (memstore, sqlitestore and pgstore do).
	Cold idem.Store
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

// Store is a tiered idem.Store.
//
// Claims, leases and fences live in the hot tier. Every claim the hot tier
// hands out (Acquired or TakenOver, first run or not) is checked against the
// cold tier before it is returned: a settled record there is replayed, and a
// cold tier that cannot answer fails the acquisition closed (the hot claim
// is given back). A completion or definite failure is written to the cold
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
	hot, cold     idem.Store
	archive       idem.Archiver
	hotKeep       time.Duration
	settleTimeout time.Duration

	afterArchive  func() // test hook: between the two writes of a settle
	beforeArchive func() // test hook: after the settle's lease check
}

// New validates cfg and returns a Store. Close closes both tiers.
func New(cfg Config) (*Store, error) {
	if cfg.Hot == nil || cfg.Cold == nil {
		return nil, errors.New("idem/tieredstore: Config.Hot and Config.Cold are required")
	}
	a, ok := cfg.Cold.(idem.Archiver)
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
// hot store applying it, so that the copy never outlives the record.
const rewarmMargin = 100 * time.Millisecond

// Acquire implements idem.Store. A claim from the hot tier is returned only
// after the cold tier said it holds no settled record for the key.
func (s *Store) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.Acquisition, error) {
	if err := (idem.Limits{}).CheckRetention(req.Retention); err != nil {
		return idem.Acquisition{}, err
	}
	a, err := s.hot.Acquire(ctx, req) // unsettled records keep the full retention
	if err != nil {
		return a, err
	}
	if a.Outcome == idem.InProgress || a.Outcome == idem.Mismatch {
		// The hot record may be another caller's momentary claim on a key
		// that the cold tier holds settled (taken to consult the cold tier
		// or to re-warm the hot one): the settled record is the answer.
		// If the cold tier cannot say, neither can we: fail closed.
		rec, err := s.cold.Get(ctx, req.Key)
		if err == nil && rec.State == idem.StateReleased && rec.Fence >= a.Record.Fence {
			// A Delete's tombstone covers the hot record's generation: the
			// Delete is under way and removes the hot copy next (which may
			// be a duplicate's momentary claim, with no work under it).
			// Neither InProgress nor the settled record is the answer.
			return idem.Acquisition{}, fmt.Errorf("%w: idem/tieredstore: the key is being deleted; retry", idem.ErrStoreUnavailable)
		}
		if errors.Is(err, idem.ErrNotFound) || (err == nil && rec.State != idem.StateCompleted && rec.State != idem.StateFailed) {
			return a, nil
		}
		if err != nil {
			return idem.Acquisition{}, fmt.Errorf("cold tier: %w", err)
		}
		if rec.Fingerprint != req.Fingerprint {
			return idem.Acquisition{Outcome: idem.Mismatch, Record: rec}, nil
		}
		return idem.Acquisition{Outcome: idem.Replayed, Record: rec}, nil
	}
	if !a.Outcome.Owns() {
		return a, nil
	}
	rec, err := s.cold.Get(ctx, req.Key)
	if errors.Is(err, idem.ErrNotFound) || (err == nil && rec.State != idem.StateCompleted && rec.State != idem.StateFailed) {
		// The claim must still stand after the cold round trip: a Delete
		// that ran meanwhile removed it (and the cold record we did not
		// see). A fenced heartbeat checks it and renews the lease.
		start := time.Now()
		if err := s.hot.Heartbeat(ctx, req.Key, a.Fence, req.Lease); err != nil {
			if errors.Is(err, idem.ErrStaleFence) {
				// Deleted, or taken over by another caller when the cold
				// read outlasted the lease: the claim is not ours.
				return idem.Acquisition{}, fmt.Errorf("%w: idem/tieredstore: the claim was deleted or taken over while the cold tier was consulted; retry", idem.ErrStoreUnavailable)
			}
			_ = s.hot.Release(context.WithoutCancel(ctx), req.Key, a.Fence)
			return idem.Acquisition{}, err
		}
		a.Record.LeaseUntil = start.Add(req.Lease) // no later than the store's
		return a, nil
	}
	bg := context.WithoutCancel(ctx)
	if err != nil {
		// Fail closed: give the claim back and report the cold tier's
		// failure. The next claim asks the cold tier again.
		_ = s.hot.Release(bg, req.Key, a.Fence)
		return idem.Acquisition{}, fmt.Errorf("cold tier: %w", err)
	}
	if rec.Fingerprint != req.Fingerprint {
		// The hot record was made by this mismatching request: drop our own
		// claim so it does not shadow the archived fingerprint.
		_ = s.hot.Delete(bg, req.Key)
		return idem.Acquisition{Outcome: idem.Mismatch, Record: rec}, nil
	}
	// Re-warm the hot tier with the archived result. The hot copy must
	// not outlive the cold record (a replay past the retention), and its
	// retention is counted when the hot write runs, a moment after this
	// one: it ends rewarmMargin early, and a record about to expire is not
	// re-warmed at all (the next duplicate asks the cold tier again).
	keep := s.hotRetention(time.Until(rec.ExpiresAt) - rewarmMargin)
	if keep < time.Millisecond {
		err = s.hot.Release(bg, req.Key, a.Fence)
	} else if rec.State == idem.StateFailed {
		err = s.hot.Fail(bg, req.Key, a.Fence, rec.Result, keep)
	} else {
		err = s.hot.Complete(bg, req.Key, a.Fence, rec.Result, keep)
	}
	if err != nil {
		_ = s.hot.Release(bg, req.Key, a.Fence)
	}
	return idem.Acquisition{Outcome: idem.Replayed, Record: rec}, nil
}

// Heartbeat implements idem.Store (hot tier).
func (s *Store) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	return s.hot.Heartbeat(ctx, key, fence, lease)
}

// Release implements idem.Store (hot tier).
func (s *Store) Release(ctx context.Context, key string, fence uint64) error {
	return s.hot.Release(ctx, key, fence)
}

// Complete implements idem.Store: settle in the hot tier (fenced), then
// archive in the cold tier.
func (s *Store) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, key, fence, result, retention, s.hot.Complete, idem.StateCompleted)
}

// Fail implements idem.Store like Complete.
func (s *Store) Fail(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, key, fence, result, retention, s.hot.Fail, idem.StateFailed)
}

type settleFunc func(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error

func (s *Store) settle(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration, hot settleFunc, st idem.State) error {
	if err := (idem.Limits{}).CheckRetention(retention); err != nil {
		return err
	}
	cur, err := s.hot.Get(ctx, key)
	if errors.Is(err, idem.ErrNotFound) || (err == nil && (cur.State != idem.StateInFlight || cur.Fence != fence)) {
		return idem.ErrStaleFence
	}
	if err != nil {
		return err
	}
	// The archive must land while the claim is still ours: once the lease
	// ended, a takeover could claim the key and the cold tier would then
	// hold the result of a settle the hot tier refuses. A fenced heartbeat
	// keeps the lease for at least SettleTimeout (never shortening it) and
	// the archive gets half of that.
	if err := s.hot.Heartbeat(ctx, key, fence, max(s.settleTimeout, time.Until(cur.LeaseUntil))); err != nil {
		return err
	}
	if s.beforeArchive != nil {
		s.beforeArchive()
	}
	rec := idem.Record{Key: key, State: st, Fence: fence, Fingerprint: cur.Fingerprint, Attempts: cur.Attempts, Result: result}
	actx, cancel := context.WithTimeout(ctx, s.settleTimeout/2)
	stored := true // what an Archiver that does not say is taken to have done
	if sa, ok := s.archive.(idem.StoredArchiver); ok {
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
	if errors.Is(err, idem.ErrStaleFence) {
		// The claim ended before the hot settle: the owner stalled longer
		// than the lease extension (CPU starvation, a long pause). If a
		// duplicate meanwhile found the archive and re-warmed the hot tier
		// with it, the settle is in effect: the result is what duplicates
		// get. Otherwise the key may be another owner's now, the owner is
		// told its settle was refused, and the archived result must not be
		// replayed: withdraw it with a tombstone of this fence (a newer
		// owner's archive, with a larger fence, stays).
		now, gerr := s.hot.Get(context.WithoutCancel(ctx), key)
		if gerr == nil && now.State == st && bytes.Equal(now.Result, result) && now.Fingerprint == cur.Fingerprint {
			return nil
		}
		// No hot record, and the archive was stored: the key was deleted
		// (or its record expired) after the archive made the result
		// visible — a duplicate may have been replayed it. The settle took
		// effect, then the key went; the owner is told so. (A Delete whose
		// tombstone came first kept the archive out: nothing was visible,
		// and the settle is refused below.)
		if errors.Is(gerr, idem.ErrNotFound) && stored {
			return nil
		}
		bg := context.WithoutCancel(ctx)
		tomb := idem.Record{Key: key, State: idem.StateReleased, Fence: fence}
		if terr := s.archive.Archive(bg, tomb, s.settleTimeout); terr != nil {
			return fmt.Errorf("%w (and withdrawing its archive failed: %v)", err, terr)
		}
		// A duplicate that read the archive before the tombstone may have
		// re-warmed the hot tier with it since: remove that copy too (the
		// cold tier answers for the key; a newer owner's archive stays).
		if now, gerr := s.hot.Get(bg, key); gerr == nil && now.State == st && bytes.Equal(now.Result, result) && now.Fingerprint == cur.Fingerprint {
			_ = s.hot.Delete(bg, key)
		}
		return err
	}
	return nil
}

// Get implements idem.Store: the hot tier, then the cold one.
func (s *Store) Get(ctx context.Context, key string) (idem.Record, error) {
	rec, err := s.hot.Get(ctx, key)
	if errors.Is(err, idem.ErrNotFound) {
		rec, err = s.cold.Get(ctx, key)
		if err == nil && rec.State != idem.StateCompleted && rec.State != idem.StateFailed {
			return idem.Record{}, idem.ErrNotFound // a Delete's tombstone
		}
	}
	return rec, err
}

// Delete implements idem.Store: the cold tier first, then the hot one, so
// that a claim taken meanwhile cannot re-warm the hot tier from a cold
// record that is about to go.
//
// An owner may be settling: its archive, already past the hot check, could
// land in the cold tier after a plain delete there and bring the record
// back. So the cold record is replaced by a tombstone carrying the largest
// fence either tier holds for the key (every settle in flight holds that
// fence or an older one), which keeps those archives out for as long as a
// settle may take (SettleTimeout); the next generation's fences are larger.
func (s *Store) Delete(ctx context.Context, key string) error {
	var fence uint64
	found := false
	for _, tier := range []idem.Store{s.hot, s.cold} {
		rec, err := tier.Get(ctx, key)
		if errors.Is(err, idem.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		fence, found = max(fence, rec.Fence), true
	}
	if found {
		tomb := idem.Record{Key: key, State: idem.StateReleased, Fence: fence}
		if err := s.archive.Archive(ctx, tomb, s.settleTimeout); err != nil {
			return err
		}
	}
	return s.hot.Delete(ctx, key)
}

// Sweep implements idem.Store: both tiers. It returns the larger of the two
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
