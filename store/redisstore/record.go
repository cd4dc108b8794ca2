package redisstore

import (
	"encoding/binary"
	"encoding/hex"

	"github.com/idemgo/idem"
)

// A record is one Redis string in the packed encoding record.lua writes
// (format 1); see there for the layout. Records of the first encoding (a
// hash per record) are still read, and rewritten on their next transition.
const (
	recordFormat = 1
	headerLen    = 33 // format … tag
)

// encodeFingerprint is the fingerprint as the scripts store and compare it:
// a 32-digit lowercase hex digest (idem.Fingerprint's) as 1 and its 16
// bytes, any other string as 0 and the string.
func encodeFingerprint(fp string) string {
	if len(fp) == 32 {
		var b [17]byte
		b[0] = 1
		if _, err := hex.Decode(b[1:], []byte(fp)); err == nil && isLowerHex(fp) {
			return string(b[:])
		}
	}
	return "\x00" + fp
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func decodeFingerprint(p string) string {
	if len(p) == 17 && p[0] == 1 {
		return hex.EncodeToString([]byte(p[1:]))
	}
	if len(p) > 0 {
		return p[1:]
	}
	return ""
}

func be48(s string) int64 {
	return int64(s[0])<<40 | int64(s[1])<<32 | int64(s[2])<<24 | int64(s[3])<<16 | int64(s[4])<<8 | int64(s[5])
}

// decodeRecord reads a packed record of either encoding (its own key's,
// or a bucket's); ok is false for anything else.
func decodeRecord(key, v string) (rec idem.Record, ok bool) {
	if len(v) > 0 && v[0] != recordFormat {
		return decodeBucketRecord(key, v)
	}
	if len(v) < headerLen+2 || v[0] != recordFormat {
		return idem.Record{}, false
	}
	rec = idem.Record{
		Key:       key,
		State:     idem.State(v[1]),
		Fence:     binary.BigEndian.Uint64([]byte(v[2:10])),
		Attempts:  int(binary.BigEndian.Uint32([]byte(v[10:14]))),
		ExpiresAt: msTime(be48(v[20:26])),
		UpdatedAt: msTime(be48(v[26:32])),
	}
	if rec.State == idem.StateInFlight {
		rec.LeaseUntil = msTime(be48(v[14:20]))
	}
	pos := headerLen
	pos += 1 + int(v[pos]) // the nonce
	if pos >= len(v) || pos+1+int(v[pos]) > len(v) {
		return idem.Record{}, false
	}
	fp := v[pos+1 : pos+1+int(v[pos])]
	pos += 1 + int(v[pos])
	rec.Fingerprint = decodeFingerprint(fp)
	if rec.State == idem.StateCompleted || rec.State == idem.StateFailed {
		rec.Result = []byte(v[pos:])
	}
	return rec, true
}
