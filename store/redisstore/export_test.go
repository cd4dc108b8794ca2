package redisstore

import "github.com/idemgo/idem"

// DecodeRecord reads a record as the scripts answer it, for the tests.
func DecodeRecord(v string) (idem.Record, bool) { return decodeRecord("", v) }

// EncodeFingerprint is the fingerprint as the scripts compare it.
func EncodeFingerprint(fp string) string { return encodeFingerprint(fp) }

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
	BucketOwnedScript   = bucketOwnedLua
)

// Locate returns the keys (own, bucket) and field of key's record.
func (s *Store) Locate(key string) (keys []string, field string) { return s.locate(key) }

// SlotTag is the hash tag that places a bucket in slot.
func SlotTag(slot int) string { return slotTags()[slot] }

// KeySlot is a key name's cluster slot.
func KeySlot(name string) int { return int(keySlot(name)) }

// BucketField and FieldKey map a storage key to its field and back.
var (
	BucketField = func(key string) string { return string(appendBucketField(nil, key)) }
	FieldKey    = fieldKey
)

// LuaParts are the scripts' pieces: the record encoding, the bucket
// layout, the two transitions and the clock.
var LuaParts = struct{ Record, Bucket, Acquire, Owned, Clock string }{recordLua, bucketLua, acquireBody, ownedBody, clockLua}
