package memstore

import (
	"bytes"
	"context"
	"hash/maphash"
	"sort"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

var (
	_ store.Store     = (*Store)(nil)
	_ store.Lister    = (*Store)(nil)
	_ store.Archiver  = (*Store)(nil)
	_ store.Unclaimer = (*Store)(nil)
)

// Config configures a Store. The zero value works.
type Config struct {
	// Shards is the number of independently locked shards, rounded up to a
	// power of two. Defaults to 64.
	Shards int
	// SweepInterval is how often a background goroutine deletes expired
	// records. Defaults to 1m; a negative value disables the sweeper (call
	// Sweep yourself).
	SweepInterval time.Duration
	// Clock tells the store's time. Defaults to the wall clock. The store
	// decides by the wall-clock part of its readings only — the time it
	// reports as LeaseUntil and ExpiresAt — never by a monotonic reading, as a
	// server store decides by its server's clock.
	Clock idem.Clock
	// Limits bound what the store accepts. Defaults to idem's defaults.
	Limits store.Limits
}

// Store is an in-memory store.Store. Every method is one critical section on
// the key's shard, so transitions are atomic.
type Store struct {
	shards []shard
	mask   uint64
	seed   maphash.Seed
	clock  idem.Clock
	limits store.Limits
	fences store.FenceSequence

	stop     chan struct{}
	done     chan struct{}
	closeOne sync.Once
}

type shard struct {
	mu sync.Mutex
	m  map[string]*entry
	_  [40]byte // keep shards on separate cache lines
}

type entry struct {
	state       store.State
	fence       uint64
	fingerprint string
	attempts    int
	result      []byte
	leaseUntil  time.Time
	expiresAt   time.Time
	updatedAt   time.Time
}

// New returns a store; Close stops its sweeper.
func New(cfg Config) *Store {
	n := cfg.Shards
	if n <= 0 {
		n = 64
	}
	size := 1
	for size < n {
		size <<= 1
	}
	s := &Store{
		shards: make([]shard, size),
		mask:   uint64(size - 1),
		seed:   maphash.MakeSeed(),
		clock:  cfg.Clock,
		limits: cfg.Limits.WithDefaults(),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if s.clock == nil {
		s.clock = idem.SystemClock{}
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	interval := cfg.SweepInterval
	if interval == 0 {
		interval = time.Minute
	}
	if interval > 0 {
		go s.sweepLoop(interval)
	} else {
		close(s.done)
	}
	return s
}

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)&s.mask]
}

func (s *Store) sweepLoop(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			_, _ = s.Sweep(context.Background(), 0)
		}
	}
}

// record is the entry as a Record the caller owns: its Result a copy, so a
// caller that modifies it changes nothing the next duplicate receives.
func (e *entry) record(key string) store.Record {
	r := store.Record{
		Key: key, State: e.state, Fence: e.fence, Fingerprint: e.fingerprint,
		Attempts: e.attempts, Result: bytes.Clone(e.result), ExpiresAt: e.expiresAt, UpdatedAt: e.updatedAt,
	}
	if e.state == store.StateInFlight {
		r.LeaseUntil = e.leaseUntil
	}
	return r
}

// Acquire implements store.Store.
func (s *Store) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	if err := ctx.Err(); err != nil {
		return store.Acquisition{}, err
	}
	if err := s.limits.CheckAcquire(req); err != nil {
		return store.Acquisition{}, err
	}
	now := s.now()
	leaseUntil := now.Add(req.Lease)
	expiresAt := now.Add(max(req.Retention, req.Lease))

	sh := s.shard(req.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[req.Key]
	if !ok || !now.Before(e.expiresAt) {
		var prev uint64
		if ok {
			prev = e.fence // an expired record still keeps fences growing
		} else {
			e = &entry{}
			sh.m[req.Key] = e
		}
		fence := s.fences.Next(now, prev)
		*e = entry{state: store.StateInFlight, fence: fence, fingerprint: req.Fingerprint, attempts: 1,
			leaseUntil: leaseUntil, expiresAt: expiresAt, updatedAt: now}
		return store.Acquisition{Outcome: store.Acquired, Fence: fence, Record: e.record(req.Key)}, nil
	}
	if e.fingerprint != req.Fingerprint {
		return store.Acquisition{Outcome: store.Mismatch, Record: e.record(req.Key)}, nil
	}
	switch e.state {
	case store.StateCompleted, store.StateFailed:
		return store.Acquisition{Outcome: store.Replayed, Record: e.record(req.Key)}, nil
	case store.StatePoisoned:
		return store.Acquisition{Outcome: store.Poisoned, Record: e.record(req.Key)}, nil
	case store.StateInFlight:
		if now.Before(e.leaseUntil) {
			return store.Acquisition{Outcome: store.InProgress, Record: e.record(req.Key)}, nil
		}
	}
	// In flight with an expired lease, or released: run again, unless the
	// attempt limit is reached.
	if req.MaxAttempts > 0 && e.attempts >= req.MaxAttempts {
		e.state = store.StatePoisoned
		e.fence = s.fences.Next(now, e.fence) // a change after the claim (see store.FencedDeleter)
		if expiresAt.After(e.expiresAt) {
			e.expiresAt = expiresAt // poisoning never shortens the retention
		}
		e.updatedAt = now
		return store.Acquisition{Outcome: store.Poisoned, Record: e.record(req.Key)}, nil
	}
	outcome := store.Acquired
	if e.state == store.StateInFlight {
		outcome = store.TakenOver
	}
	e.state = store.StateInFlight
	e.fence = s.fences.Next(now, e.fence)
	e.attempts++
	e.leaseUntil = leaseUntil
	if expiresAt.After(e.expiresAt) {
		e.expiresAt = expiresAt
	}
	e.updatedAt = now
	return store.Acquisition{Outcome: outcome, Fence: e.fence, Record: e.record(req.Key)}, nil
}

// owned runs fn on the record if it is in flight under fence.
func (s *Store) owned(ctx context.Context, key string, fence uint64, fn func(e *entry, now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[key]
	if !ok || e.state != store.StateInFlight || e.fence != fence || !now.Before(e.expiresAt) {
		return store.ErrStaleFence // absent, settled, another owner's, or past retention
	}
	fn(e, now)
	return nil
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error {
	if err := s.limits.CheckLease(lease); err != nil {
		return err
	}
	return s.owned(ctx, key, fence, func(e *entry, now time.Time) {
		e.leaseUntil = now.Add(lease)
		if e.leaseUntil.After(e.expiresAt) {
			e.expiresAt = e.leaseUntil
		}
		e.updatedAt = now
	})
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, key, fence, store.StateCompleted, result, retention)
}

// Fail implements store.Store.
func (s *Store) Fail(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error {
	return s.settle(ctx, key, fence, store.StateFailed, result, retention)
}

func (s *Store) settle(ctx context.Context, key string, fence uint64, st store.State, result []byte, retention time.Duration) error {
	if err := s.limits.CheckSettle(key, result, retention); err != nil {
		return err
	}
	var kept []byte
	if len(result) > 0 {
		kept = append([]byte(nil), result...)
	}
	return s.owned(ctx, key, fence, func(e *entry, now time.Time) {
		e.state = st
		e.result = kept
		e.leaseUntil = time.Time{}
		e.expiresAt = now.Add(retention)
		e.updatedAt = now
	})
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, key string, fence uint64) error {
	return s.owned(ctx, key, fence, func(e *entry, now time.Time) {
		e.state = store.StateReleased
		e.leaseUntil = time.Time{}
		e.updatedAt = now
	})
}

// Unclaim implements store.Unclaimer.
func (s *Store) Unclaim(ctx context.Context, key string, fence uint64) error {
	return s.endUnused(ctx, key, fence, store.StateReleased)
}

// PoisonClaim implements store.Unclaimer.
func (s *Store) PoisonClaim(ctx context.Context, key string, fence uint64) error {
	return s.endUnused(ctx, key, fence, store.StatePoisoned)
}

// endUnused ends a claim under which nothing ran in state st, taking back
// its attempt.
func (s *Store) endUnused(ctx context.Context, key string, fence uint64, st store.State) error {
	return s.owned(ctx, key, fence, func(e *entry, now time.Time) {
		e.state = st
		e.leaseUntil = time.Time{}
		e.updatedAt = now
		e.attempts = max(e.attempts-1, 0)
	})
}

// Archive implements store.Archiver.
func (s *Store) Archive(ctx context.Context, rec store.Record, retention time.Duration) error {
	_, err := s.ArchiveStored(ctx, rec, retention)
	return err
}

// ArchiveStored implements store.StoredArchiver.
func (s *Store) ArchiveStored(ctx context.Context, rec store.Record, retention time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := s.limits.CheckArchive(rec, retention); err != nil {
		return false, err
	}
	now := s.now()
	kept := append([]byte(nil), rec.Result...)
	sh := s.shard(rec.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[rec.Key]
	held := ok && (e.state == store.StateCompleted || e.state == store.StateFailed || e.state == store.StateReleased) && now.Before(e.expiresAt)
	settled := rec.State == store.StateCompleted || rec.State == store.StateFailed
	if held && (e.fence > rec.Fence || (e.fence == rec.Fence && settled)) {
		return false, nil
	}
	fence := rec.Fence
	if ok && e.fence > fence {
		fence = e.fence
	}
	sh.m[rec.Key] = &entry{state: rec.State, fence: fence, fingerprint: rec.Fingerprint, attempts: rec.Attempts,
		result: kept, expiresAt: now.Add(retention), updatedAt: now}
	return true, nil
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if err := ctx.Err(); err != nil {
		return store.Record{}, err
	}
	if err := store.ValidateKey(key); err != nil {
		return store.Record{}, err
	}
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[key]
	if !ok || !now.Before(e.expiresAt) {
		return store.Record{}, store.ErrNotFound
	}
	return e.record(key), nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
	return nil
}

// DeleteUpTo implements store.FencedDeleter.
func (s *Store) DeleteUpTo(ctx context.Context, key string, fence uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	if e, ok := sh.m[key]; ok && e.fence <= fence {
		delete(sh.m, key)
	}
	sh.mu.Unlock()
	return nil
}

// Sweep implements store.Store. A limit of zero or less means no limit.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	now := s.now()
	n := 0
	for i := range s.shards {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if limit > 0 && n >= limit {
				break
			}
			// expiresAt is never before leaseUntil, so a live lease survives.
			if !now.Before(e.expiresAt) {
				delete(sh.m, k)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n, nil
}

// CountStates implements store.StateCounter.
func (s *Store) CountStates(ctx context.Context) (map[store.State]int64, error) {
	now := s.now()
	out := map[store.State]int64{}
	for i := range s.shards {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if now.Before(e.expiresAt) {
				out[e.state]++
			}
		}
		sh.mu.Unlock()
	}
	return out, nil
}

// List implements store.Lister. It copies and sorts every key: for operators,
// not for hot paths.
func (s *Store) List(ctx context.Context, after string, limit int) ([]store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := s.now()
	var out []store.Record
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if k > after && now.Before(e.expiresAt) {
				out = append(out, e.record(k))
			}
		}
		sh.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// now is the store's time: its clock's reading without the monotonic
// reading time.Now adds, so that expiry and leases are decided by the times
// the store reports — also when the system's clock is stepped, or the
// thread was descheduled between time.Now's two clock reads.
func (s *Store) now() time.Time { return s.clock.Now().Round(0) }

// Len returns the number of records held, expired or not.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].m)
		s.shards[i].mu.Unlock()
	}
	return n
}

// Close stops the sweeper. The records stay readable.
func (s *Store) Close() error {
	s.closeOne.Do(func() { close(s.stop) })
	<-s.done
	return nil
}
