package store

import (
	"context"
	"fmt"
	"time"
)

// Store is the contract every backend implements and store/storetest proves.
//
// Every method is one atomic operation against the backend — a single SQL
// statement, one Lua script, one critical section — so there is no
// read-then-write race between processes sharing the store. Times (lease,
// retention) are taken from the store's clock.
//
// Heartbeat, Complete, Fail and Release succeed only with the record's current
// fence while it is in flight and not past its retention; otherwise they
// return ErrStaleFence and change nothing. That is what stops a zombie owner,
// waking after its lease was taken over, from overwriting the new owner's
// result.
//
// Fences. Every acquisition that hands out a claim (Acquired, TakenOver)
// issues a fence strictly larger than every fence issued before for that key,
// also across generations: after the record was deleted, swept or expired.
// The rule is fence = max(previous fence of the record + 1, FenceFloor(store
// clock)), the floor being the store's clock in microseconds. Within a
// generation fences grow by the record; across generations they grow with
// the clock, which holds as long as the store's clock does not step back past
// the old generation's last acquisition (memstore and sqlitestore also keep a
// process-wide FenceSequence, so there they grow even under a stopped or
// injected clock).
//
// Retention. A record past its ExpiresAt is absent for every method, whether
// or not the backend has deleted it yet: Get says ErrNotFound, Acquire starts
// a new generation (attempts 1), and a late settle or heartbeat is
// ErrStaleFence. Acquire never shortens a record's expiry: a takeover, a
// re-run after a release and poisoning extend it to at least now + the
// request's retention; a release keeps it. Complete and Fail set it to now +
// their retention.
type Store interface {
	// Acquire interrogates and, where the key is free, claims it:
	//   absent, released or past retention → Acquired (fence grows);
	//   in flight, lease live                → InProgress;
	//   in flight, lease expired             → TakenOver, strictly larger fence;
	//   completed or failed                  → Replayed, with the record;
	//   another fingerprint                  → Mismatch, nothing changes;
	//   attempts reached MaxAttempts         → Poisoned (the record becomes poisoned).
	Acquire(ctx context.Context, req AcquireRequest) (Acquisition, error)
	// Heartbeat extends the lease to now+lease.
	Heartbeat(ctx context.Context, key string, fence uint64, lease time.Duration) error
	// Complete stores result and keeps the record for retention.
	Complete(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error
	// Fail stores a definite failure, replayed to duplicates for retention.
	Fail(ctx context.Context, key string, fence uint64, result []byte, retention time.Duration) error
	// Release gives the lease back; the next acquire runs the work again.
	Release(ctx context.Context, key string, fence uint64) error
	// Get returns the record, or ErrNotFound.
	Get(ctx context.Context, key string) (Record, error)
	// Delete forgets the key whatever its state. Deleting an absent key is
	// not an error.
	Delete(ctx context.Context, key string) error
	// Sweep deletes up to limit records past their retention and returns how
	// many it deleted. It never deletes a record under a live lease.
	Sweep(ctx context.Context, limit int) (int, error)
	// Close releases the store's resources.
	Close() error
}

// Lister is implemented by stores that can enumerate their records, in
// storage-key order, for operators (idem keys ls, purge).
type Lister interface {
	// List returns up to limit live records whose storage key comes after
	// after ("" for the first) in the store's order of keys: a page goes on
	// from the last key of the one before. The order is the keys' own,
	// byte by byte, except on PostgreSQL tables of the packed layout,
	// which order keys by their packed form.
	List(ctx context.Context, after string, limit int) ([]Record, error)
}

// StateCounter is implemented by stores that count their live records by
// state in one query (an operator's overview).
type StateCounter interface {
	CountStates(ctx context.Context) (map[State]int64, error)
}

// Scanner is implemented by stores that keep no order of their keys (Redis:
// SCAN, per node of a cluster). Walking them with Lister costs a scan of
// the whole key space per page; Scan continues from a cursor instead.
type Scanner interface {
	// Scan returns up to about limit live records from cursor ("" starts
	// a walk) and the cursor of the next page ("" when the walk is done),
	// in no particular order. Every record live for the whole walk is
	// returned at least once; one may be returned twice (a caller that
	// must visit each record once keeps the keys it has seen).
	Scan(ctx context.Context, cursor string, limit int) (recs []Record, next string, err error)
}

// Archiver is implemented by stores that can hold a settled record written
// by another tier (see store/tieredstore): the cold store of a tiered pair.
type Archiver interface {
	// Archive stores rec for retention, in one atomic operation. rec is
	// completed or failed — a settled record — or released: a tombstone
	// that removes the key's records up to its fence and keeps a late
	// archive of those fences out (the tiered store's Delete writes one
	// with the hot tier's fence, so an archive in flight when the key was
	// deleted cannot bring the record back).
	//
	// A live settled record or tombstone already held for rec.Key is kept
	// if its fence is larger than rec.Fence, or equal and rec is settled
	// (for one fence the first result wins, and a tombstone wins over its
	// own generation's late result); anything else under the key is
	// replaced. The stored fence never decreases.
	//
	// A store reached over a network applies an archive only if it reaches
	// the server before ctx's deadline (pgstore, by the database's clock),
	// so an archive held up on the way past the moment its caller was told
	// it failed never lands later: the tiered store gives an archive half
	// of the lease it holds, and a takeover may follow once it failed.
	Archive(ctx context.Context, rec Record, retention time.Duration) error
}

// Unclaimer is implemented by stores that can end a claim under which
// nothing ran, taking back the attempt the claim counted, so MaxAttempts
// counts only acquisitions that may have run work. Each is one atomic
// operation, accepted only while the record is in flight under fence
// (ErrStaleFence otherwise):
//   - Unclaim is Release (the record becomes released) that also takes
//     back the attempt. The tiered store uses it when it fails an
//     acquisition closed after taking the hot claim (the cold tier
//     unreachable): a store outage must not poison a key whose work never
//     ran.
//   - PoisonClaim makes the record poisoned, as an acquisition at
//     MaxAttempts would have found it: the attempt taken back, the fence and
//     the expiry kept. The tiered store claims in its hot tier without
//     MaxAttempts and poisons there a claim that went past it once the cold
//     tier said the key is not settled — in one step, so that no other
//     caller sees the key released, or claims it, in between.
//
// Every store of this module implements it.
type Unclaimer interface {
	Unclaim(ctx context.Context, key string, fence uint64) error
	PoisonClaim(ctx context.Context, key string, fence uint64) error
}

// FencedDeleter is implemented by stores that can delete a key's record
// only up to a fence. DeleteUpTo removes key's record if its fence is at
// most fence and keeps a record with a larger fence — a later generation's
// claim, made after the caller read the record it means to delete, or a
// poisoning of the claim at its attempt limit (which takes a fence of its
// own for that reason). It
// returns nil whether or not it removed a record. The tiered store drops
// its own hot claims this way (a claim whose cold read found another
// fingerprint's record, a re-warmed copy of a withdrawn settle), so that a
// claim another request made meanwhile stays. memstore, sqlitestore,
// pgstore and redisstore implement it.
type FencedDeleter interface {
	DeleteUpTo(ctx context.Context, key string, fence uint64) error
}

// StoredArchiver is an Archiver that also tells whether rec was stored
// (false: what the key held was kept, by Archive's rules). The tiered store
// uses it to tell a settle whose archive a concurrent Delete kept out (its
// result never visible: the settle is refused) from one whose archive was
// stored and then deleted (its result was visible: the settle took effect).
// memstore, sqlitestore and pgstore implement it.
type StoredArchiver interface {
	Archiver
	ArchiveStored(ctx context.Context, rec Record, retention time.Duration) (stored bool, err error)
}

// ArchiveAwaiter is implemented by archivers whose archive may be applied
// after its caller was told it failed: a database goes on with a statement
// its client gave up on (waiting for the key's row, or for its commit to
// reach the disk) when neither the answer nor a cancellation gets through.
// GetAwaitingArchives is Get that first waits for the archives of key under
// way: a read made once every archive's deadline has passed sees each one
// that will ever land. The tiered store reads its cold tier so before it
// hands out a claim or answers Poisoned, so that an owner's archive given
// up on never lands beside the next owner's claim, or after the key was
// dead-lettered. pgstore implements it; memstore and
// sqlitestore apply an archive within the call or not at all.
type ArchiveAwaiter interface {
	GetAwaitingArchives(ctx context.Context, key string) (Record, error)
}

// Migrator is implemented by stores with a schema to create or upgrade.
// Migrate is idempotent.
type Migrator interface {
	Migrate(ctx context.Context) error
}

// Limits bound what a store accepts. The zero value means the defaults.
type Limits struct {
	// MaxResultBytes bounds a stored result. Defaults to 1 MiB.
	MaxResultBytes int
	// MaxLease bounds a lease (and a heartbeat extension). Defaults to 1h.
	MaxLease time.Duration
	// MaxRetention bounds a retention. Defaults to 90 days.
	MaxRetention time.Duration
}

// Default limits.
const (
	DefaultMaxResultBytes = 1 << 20
	DefaultMaxLease       = time.Hour
	DefaultMaxRetention   = 90 * 24 * time.Hour
)

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxResultBytes <= 0 {
		l.MaxResultBytes = DefaultMaxResultBytes
	}
	if l.MaxLease <= 0 {
		l.MaxLease = DefaultMaxLease
	}
	if l.MaxRetention <= 0 {
		l.MaxRetention = DefaultMaxRetention
	}
	return l
}

// CheckAcquire validates an acquire request against l (with defaults).
func (l Limits) CheckAcquire(req AcquireRequest) error {
	if err := ValidateKey(req.Key); err != nil {
		return err
	}
	if len(req.Fingerprint) > MaxFingerprintBytes {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidFingerprint, len(req.Fingerprint), MaxFingerprintBytes)
	}
	if err := l.CheckLease(req.Lease); err != nil {
		return err
	}
	if err := l.CheckRetention(req.Retention); err != nil {
		return err
	}
	if req.MaxAttempts < 0 {
		return fmt.Errorf("idem: invalid MaxAttempts %d: must be 0 (no limit) or positive", req.MaxAttempts)
	}
	return nil
}

// CheckLease validates a lease duration: positive, at least a millisecond
// (the stores' resolution), at most MaxLease.
func (l Limits) CheckLease(d time.Duration) error {
	l = l.WithDefaults()
	if d < time.Millisecond {
		return fmt.Errorf("%w: %v, must be at least 1ms", ErrInvalidLease, d)
	}
	if d > l.MaxLease {
		return fmt.Errorf("%w: %v, the limit is %v", ErrInvalidLease, d, l.MaxLease)
	}
	return nil
}

// CheckRetention validates a retention: at least a millisecond, at most
// MaxRetention.
func (l Limits) CheckRetention(d time.Duration) error {
	l = l.WithDefaults()
	if d < time.Millisecond {
		return fmt.Errorf("%w: %v, must be at least 1ms", ErrInvalidRetention, d)
	}
	if d > l.MaxRetention {
		return fmt.Errorf("%w: %v, the limit is %v", ErrInvalidRetention, d, l.MaxRetention)
	}
	return nil
}

// CheckHeartbeat validates the arguments of Heartbeat.
func (l Limits) CheckHeartbeat(key string, lease time.Duration) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	return l.CheckLease(lease)
}

// CheckSettle validates the arguments of Complete or Fail.
func (l Limits) CheckSettle(key string, result []byte, retention time.Duration) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	l = l.WithDefaults()
	if len(result) > l.MaxResultBytes {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrResultTooLarge, len(result), l.MaxResultBytes)
	}
	return l.CheckRetention(retention)
}

// CheckArchive validates the arguments of Archiver.Archive: a completed or
// failed record that fits the limits.
func (l Limits) CheckArchive(rec Record, retention time.Duration) error {
	if rec.State != StateCompleted && rec.State != StateFailed && rec.State != StateReleased {
		return fmt.Errorf("idem: Archive takes a completed or failed record, or a released one (a tombstone), not %v", rec.State)
	}
	if len(rec.Fingerprint) > MaxFingerprintBytes {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidFingerprint, len(rec.Fingerprint), MaxFingerprintBytes)
	}
	return l.CheckSettle(rec.Key, rec.Result, retention)
}
