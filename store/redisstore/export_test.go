package redisstore

import "github.com/idemgo/idem"

// DecodeRecord reads a record as the scripts answer it, for the tests.
func DecodeRecord(v string) (idem.Record, bool) { return decodeRecord("", v) }

// EncodeFingerprint is the fingerprint as the scripts compare it.
func EncodeFingerprint(fp string) string { return encodeFingerprint(fp) }

// The batch forms of the scripts (five arguments per key), for the tests.
var (
	AcquireManyScript = acquireManyLua
	OwnedManyScript   = ownedManyLua
)
