package redisstore_test

import (
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/redisstore"
)

// FuzzBucketField: every storage key's field in a bucket reads back as the
// key (so two keys never share a field), a compact key's field is its 16
// bytes, and no other key's field is 16 bytes long.
func FuzzBucketField(f *testing.F) {
	for _, k := range []string{"k", strings.Repeat("x", 15), strings.Repeat("y", 16), "\x00\x01", "\x01" + strings.Repeat("z", 13) + "\x01",
		idem.CompactKey(idem.Key{Scope: "s", ID: "id"}), "1~AAAAAAAAAAAAAAAAAAAAAB" /* pad bits set: not canonical */} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if key == "" {
			return // not a storage key
		}
		field := redisstore.BucketField(key)
		if back := redisstore.FieldKey(field); back != key {
			t.Fatalf("key %q: field %q reads back as %q", key, field, back)
		}
		if len(field) == 16 && !strings.HasPrefix(key, "1~") {
			t.Fatalf("key %q has a 16-byte field", key)
		}
	})
}

// TestCompactKeyFieldIs16Bytes: a compact key's field is its digest.
func TestCompactKeyFieldIs16Bytes(t *testing.T) {
	if f := redisstore.BucketField(idem.CompactKey(idem.Key{Scope: "s", ID: "id"})); len(f) != 16 {
		t.Fatalf("compact key's field: %d bytes", len(f))
	}
}
