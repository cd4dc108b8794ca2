package redisstore

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/store"
)

// DecodeRecord reads a record as the scripts answer it, for the tests.
func DecodeRecord(v string) (store.Record, bool) { return decodeRecord("", v) }

// EncodeFingerprint is the fingerprint as the scripts compare it.
func EncodeFingerprint(fp string) string { return keypack.Fingerprint(fp) }

// BatchScript is the script of a coalesced batch (a key per call, the
// calls packed in its one argument by PackAcquire and PackOwned).
var BatchScript = batchLua

// PackAcquire and PackOwned append a call as BatchScript reads it (a key
// per record, no field).
func PackAcquire(b []byte, fp string, lease, keep int64, maxAttempts int, nonce string) []byte {
	c := scriptCall{acquire: true, fp: fp, lease: lease, keep: keep, maxAttempts: maxAttempts}
	copy(c.nonce[:], nonce)
	return c.appendPacked(b)
}

func PackOwned(b []byte, op string, fence uint64, ms int64, result []byte, nonce string) []byte {
	c := scriptCall{op: op, fence: fence, ms: ms, result: result}
	copy(c.nonce[:], nonce)
	return c.appendPacked(b)
}

// The bucketed scripts (Config.Buckets): keys the record's own and its
// bucket, the field first among the arguments.
var (
	BucketAcquireScript = bucketAcquireLua
	BucketOwnedScript   = bucketSettleLua
)

// Locate returns the keys (own, bucket) and field of key's record.
func (s *Store) Locate(key string) (keys []string, field string) { return s.locate(key) }

// SlotTag is the hash tag that places a bucket in slot.
func SlotTag(slot int) string { return slotTags()[slot] }

// KeySlot is a key name's cluster slot.
func KeySlot(name string) int { return int(keySlot(name)) }

// BucketField and FieldKey map a storage key to its field and back.
var (
	BucketField = func(key string) string { return string(keypack.AppendKey(nil, key)) }
	FieldKey    = keypack.Key
)

// LuaParts are the scripts' pieces: the record encoding, the bucket
// layout, the two transitions and the clock.
var LuaParts = struct{ Record, Bucket, Acquire, Owned, Clock string }{recordLua, bucketLua, acquireBody, ownedBody, clockLua}

// Batch runs one coalesced batch, as the store's group would: for each key
// an acquisition (fence 0, a minute's lease, an hour's retention) or a
// completion under its fence with result. Each call's error, or
// store.ErrStaleFence for a completion refused; an acquisition's outcome.
func (s *Store) Batch(ctx context.Context, keys []string, fences []uint64, result []byte) ([]store.Outcome, []error) {
	calls := make([]scriptCall, len(keys))
	for i, key := range keys {
		c := scriptCall{one: s.ownedScript, op: "c", fence: fences[i], ms: 3600000, result: result}
		if fences[i] == 0 {
			c = scriptCall{one: s.acquireScript, acquire: true, fp: keypack.Fingerprint(""), lease: 60000, keep: 3600000}
		}
		c.keys, c.field = s.locate(key)
		c.nonce = s.nonce()
		calls[i] = c
	}
	out := make([]answer, len(calls))
	s.runMany(ctx, calls, out)
	outcomes, errs := make([]store.Outcome, len(calls)), make([]error, len(calls))
	for i, a := range out {
		switch v, err := a.val, a.err; {
		case err != nil:
			errs[i] = err
		case calls[i].acquire:
			outcomes[i] = store.Outcome(v.([]any)[0].(int64))
		case v == int64(0):
			errs[i] = store.ErrStaleFence
		}
	}
	return outcomes, errs
}

// UseSettleFlags puts line in place of the flags line of the store's
// settle scripts (allowOOM), as if the server refused that one.
func (s *Store) UseSettleFlags(line string) {
	one, batch := settleLua, settleBatchLua
	if s.bucketsPerSlot > 0 {
		one, batch = bucketSettleLua, bucketSettleBatchLua
	}
	s.settleScript = redis.NewScript(line + strings.TrimPrefix(one, allowOOM))
	s.settleBatchScript = redis.NewScript(line + strings.TrimPrefix(batch, allowOOM))
}

// SettleFlagsRefused: the server refused the settle scripts' flags line,
// and settles go without it.
func (s *Store) SettleFlagsRefused() bool { return s.flagsRefused.Load() }
