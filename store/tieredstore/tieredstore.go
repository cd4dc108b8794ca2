package tieredstore

import (
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
}

// Store is a tiered idem.Store.
type Store struct {
	hot, cold idem.Store
	archive   idem.Archiver
	hotKeep   time.Duration
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
	if cfg.HotRetention == 0 {
		cfg.HotRetention = time.Hour
	}
	return &Store{hot: cfg.Hot, cold: cfg.Cold, archive: a, hotKeep: cfg.HotRetention}, nil
}

func (s *Store) hotRetention(d time.Duration) time.Duration { return min(d, s.hotKeep) }

// Acquire implements idem.Store. A key new to the hot tier is looked up in
// the cold tier before the claim is handed out.
func (s *Store) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.Acquisition, error) {
	if err := (idem.Limits{}).CheckRetention(req.Retention); err != nil {
		return idem.Acquisition{}, err
	}
	hreq := req
	hreq.Retention = s.hotRetention(req.Retention)
	a, err := s.hot.Acquire(ctx, hreq)
	if err != nil || a.Outcome != idem.Acquired || a.Record.Attempts != 1 {
		return a, err
	}
	rec, err := s.cold.Get(ctx, req.Key)
	if errors.Is(err, idem.ErrNotFound) || (err == nil && rec.State != idem.StateCompleted && rec.State != idem.StateFailed) {
		return a, nil
	}
	bg := context.WithoutCancel(ctx)
	if err != nil {
		// Fail closed: give the claim back and report the cold tier's failure.
		_ = s.hot.Release(bg, req.Key, a.Fence)
		return idem.Acquisition{}, fmt.Errorf("cold tier: %w", err)
	}
	if rec.Fingerprint != req.Fingerprint {
		_ = s.hot.Delete(bg, req.Key)
		return idem.Acquisition{Outcome: idem.Mismatch, Record: rec}, nil
	}
	// Re-warm the hot tier with the archived result.
	keep := s.hotRetention(max(time.Until(rec.ExpiresAt), time.Millisecond))
	if rec.State == idem.StateFailed {
		err = s.hot.Fail(bg, req.Key, a.Fence, rec.Result, keep)
	} else {
		err = s.hot.Complete(bg, req.Key, a.Fence, rec.Result, keep)
	}
	if err != nil {
		_ = s.hot.Delete(bg, req.Key)
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
	return s.settle(ctx, key, fence, result, retention, s.hot.Complete)
}

// Fail implements idem.Store like Complete.
func (s *Store) Fail(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, key, fence, result, retention, s.hot.Fail)
}

type settleFunc func(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error

func (s *Store) settle(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration, hot settleFunc) error {
	if err := (idem.Limits{}).CheckRetention(retention); err != nil {
		return err
	}
	if err := hot(ctx, key, fence, result, s.hotRetention(retention)); err != nil {
		return err
	}
	rec, err := s.hot.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("idem/tieredstore: settled in the hot tier, not archived: %w", err)
	}
	if err := s.archive.Archive(ctx, rec, retention); err != nil {
		return fmt.Errorf("idem/tieredstore: settled in the hot tier, not archived: %w", err)
	}
	return nil
}

// Get implements idem.Store: the hot tier, then the cold one.
func (s *Store) Get(ctx context.Context, key string) (idem.Record, error) {
	rec, err := s.hot.Get(ctx, key)
	if errors.Is(err, idem.ErrNotFound) {
		return s.cold.Get(ctx, key)
	}
	return rec, err
}

// Delete implements idem.Store: both tiers.
func (s *Store) Delete(ctx context.Context, key string) error {
	return errors.Join(s.hot.Delete(ctx, key), s.cold.Delete(ctx, key))
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
