package redisstore

import "testing"

// FuzzDecodeRecord: whatever a key holds, reading it as a record returns or
// refuses it, never panics; a fingerprint survives its encoding.
func FuzzDecodeRecord(f *testing.F) {
	f.Add("\x01\x02\x00\x06\x41\x7e\x42\xe7\xec\x6a\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01\xa2\x2c\x9c\xd9\x85\x01\xa2\x2c\x9d\x4e\xb5\x53\x02ab\x03fp1done", "0123456789abcdef0123456789abcdef")
	f.Add("", "fp")
	f.Add("\xe2\x00\x06\x41\x7e\x42\xe7\xec\x01\x00\x01\xa2\x2c\x9c\xd9\x00\x36\xee\x80\x00\x00\x00\x02"+"0123456789abcdef"+"done", "fp") // a bucket's (format 2)
	f.Fuzz(func(t *testing.T, v, fp string) {
		_, _ = decodeRecord("k", v)
		if got := decodeFingerprint(encodeFingerprint(fp)); got != fp {
			t.Fatalf("fingerprint %q came back as %q", fp, got)
		}
	})
}
