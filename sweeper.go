package idem

import (
	"context"
	"errors"
	"github.com/idemgo/idem/store"
	"time"
)

// SweeperConfig configures a Sweeper.
type SweeperConfig struct {
	// Store to sweep. Required.
	Store store.Store
	// Interval between passes. Defaults to 1m.
	Interval time.Duration
	// Batch is the most records one Sweep call deletes; a pass calls Sweep
	// until a call deletes fewer. Defaults to 1000.
	Batch int
	// OnPass, if set, is called after every pass with the number of records
	// deleted and the error that ended the pass, if any.
	OnPass func(deleted int, err error)
}

// Sweeper deletes records past their retention in the background, in
// batches, so a SQL table does not grow without bound. It never deletes a
// record under a live lease (that is Store.Sweep's contract).
type Sweeper struct {
	cfg SweeperConfig
	w   Worker
}

// NewSweeper validates cfg and returns a stopped Sweeper.
func NewSweeper(cfg SweeperConfig) (*Sweeper, error) {
	if cfg.Store == nil {
		return nil, errors.New("idem: SweeperConfig.Store is required")
	}
	if cfg.Interval < 0 || cfg.Batch < 0 {
		return nil, errors.New("idem: SweeperConfig.Interval and Batch must not be negative")
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Batch == 0 {
		cfg.Batch = 1000
	}
	return &Sweeper{cfg: cfg}, nil
}

// SweepNow runs one full pass and returns how many records it deleted.
func (s *Sweeper) SweepNow(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := s.cfg.Store.Sweep(ctx, s.cfg.Batch)
		total += n
		if err != nil || n < s.cfg.Batch {
			if s.cfg.OnPass != nil {
				s.cfg.OnPass(total, err)
			}
			return total, err
		}
	}
}

// Start begins sweeping every Interval until Stop or ctx ends. Starting a
// started sweeper is an error.
func (s *Sweeper) Start(ctx context.Context) error {
	return s.w.Start(ctx, func(ctx context.Context) {
		t := time.NewTicker(s.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_, _ = s.SweepNow(ctx)
			}
		}
	})
}

// Stop ends the sweeping and waits for a running pass to return (or ctx to
// end). Stopping a stopped sweeper does nothing.
func (s *Sweeper) Stop(ctx context.Context) error { return s.w.Stop(ctx) }
