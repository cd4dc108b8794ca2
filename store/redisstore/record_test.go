package redisstore

import "testing"

// FuzzDecodeRecord: whatever a key holds, reading it as a record returns or
// refuses it, never panics (a fingerprint's packing: internal/keypack).
func FuzzDecodeRecord(f *testing.F) {
	f.Add("\x01\x02\x00\x06\x41\x7e\x42\xe7\xec\x6a\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01\xa2\x2c\x9c\xd9\x85\x01\xa2\x2c\x9d\x4e\xb5\x53\x02ab\x03fp1done", "0123456789abcdef0123456789abcdef")
	f.Add("", "fp")
	f.Add("\xe2\x00\x06\x41\x7e\x42\xe7\xec\x01\x00\x01\xa2\x2c\x9c\xd9\x00\x36\xee\x80\x00\x00\x00\x02"+"0123456789abcdef"+"done", "fp") // high flag bits no encoding writes
	f.Add("\x72\x00\x00\x03\xe8\x01\x00\x01\xa2\x2c\x9c\xd9\x00\x36\xee\x80\x00\x00\x00\x02"+"0123456789abcdef"+"done", "fp")             // a bucket's value, the fence an offset
	f.Add("\x14\x00\x00\x00\x01\x01\x00\x01\xa2\x2c\x9c\xd9\x00\x36\xee\x80\x00", "")                                                     // format 3's shortest: poisoned, no fingerprint
	f.Fuzz(func(t *testing.T, v, _ string) {
		_, _ = decodeRecord("k", v)
	})
}

// TestDecodeBucketRecord: the seeds of bucket values read as bucket.lua
// writes them: the fence below the last transition, the shortest value (a
// poisoned record without a fingerprint) whole.
func TestDecodeBucketRecord(t *testing.T) {
	rec, ok := decodeRecord("k", "\x72\x00\x00\x03\xe8\x01\x00\x01\xa2\x2c\x9c\xd9\x00\x36\xee\x80\x00\x00\x00\x02"+"0123456789abcdef"+"done")
	updated := int64(0x01a22c9cd9) - 0x36ee80
	if !ok || rec.State != 2 || rec.Fence != uint64(updated+1)*1000-1000 || rec.Attempts != 1 || rec.UpdatedAt.UnixMilli() != updated ||
		rec.Fingerprint != "30313233343536373839616263646566" || string(rec.Result) != "done" {
		t.Fatalf("completed: %+v %v", rec, ok)
	}
	rec, ok = decodeRecord("k", "\x14\x00\x00\x00\x01\x01\x00\x01\xa2\x2c\x9c\xd9\x00\x36\xee\x80\x00")
	if !ok || rec.State != 4 || rec.Fingerprint != "" || rec.Fence != uint64(updated+1)*1000-1 {
		t.Fatalf("poisoned: %+v %v", rec, ok)
	}
}
