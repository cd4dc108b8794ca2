package redisstore

import (
	"encoding/binary"

	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/store"
)

// A record is one Redis string in the packed encoding record.lua writes
// (format 1); see there for the layout.
const (
	recordFormat = 1
	headerLen    = 33 // format … tag
)

func be48(s string) int64 {
	return int64(s[0])<<40 | int64(s[1])<<32 | int64(s[2])<<24 | int64(s[3])<<16 | int64(s[4])<<8 | int64(s[5])
}

// decodeRecord reads a packed record, its own key's or a bucket's (whose
// first byte, its flags, is never 1); ok is false for anything else.
func decodeRecord(key, v string) (rec store.Record, ok bool) {
	if len(v) > 0 && v[0] != recordFormat {
		return decodeBucketRecord(key, v)
	}
	if len(v) < headerLen+2 || v[0] != recordFormat {
		return store.Record{}, false
	}
	rec = store.Record{
		Key:       key,
		State:     store.State(v[1]),
		Fence:     binary.BigEndian.Uint64([]byte(v[2:10])),
		Attempts:  int(binary.BigEndian.Uint32([]byte(v[10:14]))),
		ExpiresAt: msTime(be48(v[20:26])),
		UpdatedAt: msTime(be48(v[26:32])),
	}
	if rec.State == store.StateInFlight {
		rec.LeaseUntil = msTime(be48(v[14:20]))
	}
	pos := headerLen
	pos += 1 + int(v[pos]) // the nonce
	if pos >= len(v) || pos+1+int(v[pos]) > len(v) {
		return store.Record{}, false
	}
	fp := v[pos+1 : pos+1+int(v[pos])]
	pos += 1 + int(v[pos])
	rec.Fingerprint = keypack.UnpackFingerprint(fp)
	if rec.State == store.StateCompleted || rec.State == store.StateFailed {
		rec.Result = []byte(v[pos:])
	}
	return rec, true
}
