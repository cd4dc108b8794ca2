package redisstore

import (
	"encoding/binary"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/store"
)

// Buckets (Config.Buckets): the records of many keys share one hash, laid
// out by bucket.lua. A key's bucket is in the cluster slot of the key's own
// name (so one script may read and write both) and is chosen among the
// slot's buckets by the key's hash:
//
//	prefix + "{" + slotTag(slot) + "}$" + n
//
// where slotTag(slot) is the shortest name Redis hashes to that slot.
const clusterSlots = 16384

// locateInBucket returns the own key name of key's record, its bucket's
// name (see above) and its field, cut from one string: one allocation for
// the three (they are made for every transition).
func (s *Store) locateInBucket(key string) (name, bucket, field string) {
	var fb [64]byte
	f := keypack.AppendKey(fb[:0], key)
	n := uint32(0)
	if s.bucketsPerSlot > 1 {
		n = fnv32(f) % uint32(s.bucketsPerSlot)
	}
	const maxDigits = 10
	b := make([]byte, 0, 2*len(s.prefix)+len(key)+len(f)+maxDigits+12)
	b = append(b, s.prefix...)
	b = append(b, '{')
	b = append(b, key...)
	b = append(b, '}')
	nameEnd := len(b)
	tag := slotTags()[keySlot(b[:nameEnd])]
	b = append(b, s.prefix...)
	b = append(b, '{')
	b = append(b, tag...)
	b = append(b, "}$"...)
	b = strconv.AppendUint(b, uint64(n), 10)
	bucketEnd := len(b)
	b = append(b, f...)
	all := unsafe.String(unsafe.SliceData(b), len(b)) // b is not written again
	return all[:nameEnd], all[nameEnd:bucketEnd], all[bucketEnd:]
}

// isBucket: name, found under the prefix, is a bucket (a record's own key
// ends with its hash tag's "}").
func (s *Store) isBucket(name string) bool {
	return !strings.HasSuffix(name, "}")
}

func fnv32[T string | []byte](s T) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// keySlot is the Redis Cluster slot of a key name: CRC16 of its hash tag
// (the part between the first "{" and the next "}", if not empty) or of the
// whole name, modulo 16384.
func keySlot[T string | []byte](name T) uint16 {
	for i := 0; i < len(name); i++ {
		if name[i] != '{' {
			continue
		}
		for j := i + 1; j < len(name); j++ {
			if name[j] == '}' {
				if j > i+1 {
					name = name[i+1 : j]
				}
				break
			}
		}
		break
	}
	return crc16(name) % clusterSlots
}

// crc16 is CRC-16/XMODEM, the cluster's key hash.
func crc16[T string | []byte](s T) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table is CRC-16/XMODEM (polynomial 0x1021) of each byte.
var crc16Table = func() (t [256]uint16) {
	for b := range t {
		crc := uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[b] = crc
	}
	return t
}()

// slotTags returns, for each slot, the first name in base-36 counting order
// that hashes to it.
var slotTags = sync.OnceValue(func() *[clusterSlots]string {
	var tags [clusterSlots]string
	left := clusterSlots
	for n := uint64(0); left > 0; n++ {
		t := strconv.FormatUint(n, 36)
		if slot := crc16(t) % clusterSlots; tags[slot] == "" {
			tags[slot] = t
			left--
		}
	}
	return &tags
})

// decodeBucketRecord reads a record of a bucket's encoding (bucket.lua).
func decodeBucketRecord(key, v string) (rec store.Record, ok bool) {
	const head, offsetHead = 19, 16 // flags … expires at less updated at
	if len(v) < offsetHead+1 {
		return store.Record{}, false
	}
	fl := v[0]
	var fence uint64
	pos := 1
	offset := fl&16 != 0
	if offset {
		fence = uint64(binary.BigEndian.Uint32([]byte(v[1:5])))
		pos = 5
	} else {
		if len(v) < head+1 {
			return store.Record{}, false
		}
		fence = uint64(v[1])<<48 | uint64(be48(v[2:8]))
		pos = 8
	}
	expires := be48(v[pos+1 : pos+7])
	updated := expires - int64(binary.BigEndian.Uint32([]byte(v[pos+7:pos+11])))
	if offset {
		fence = uint64(updated+1)*1000 - fence
	}
	rec = store.Record{
		Key:       key,
		State:     store.State(fl & 7),
		Fence:     fence,
		Attempts:  int(v[pos]),
		ExpiresAt: msTime(expires),
		UpdatedAt: msTime(updated),
	}
	pos += 11
	switch {
	case rec.State == store.StateInFlight:
		if len(v) < pos+17 {
			return store.Record{}, false
		}
		rec.LeaseUntil = msTime(be48(v[pos : pos+6]))
		pos += 17 // lease, tag, nonce
	case fl&32 != 0:
		pos += 4 // the settle's nonce
	}
	if fl&64 != 0 {
		if len(v) < pos+16 {
			return store.Record{}, false
		}
		rec.Fingerprint = keypack.UnpackFingerprint("\x01" + v[pos:pos+16])
		pos += 16
	} else {
		if len(v) < pos+1 || len(v) < pos+1+int(v[pos]) {
			return store.Record{}, false
		}
		rec.Fingerprint = v[pos+1 : pos+1+int(v[pos])]
		pos += 1 + int(v[pos])
	}
	if rec.State == store.StateCompleted || rec.State == store.StateFailed {
		rec.Result = []byte(v[pos:])
	}
	return rec, true
}
