package keypack_test

import (
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/keypack"
	"github.com/idemgo/idem/store"
)

// FuzzKey: every storage key's packed form reads back as the key (so two
// keys never share one), a compact key packs to its 16 bytes, and no other
// key packs to 16 bytes.
func FuzzKey(f *testing.F) {
	for _, k := range []string{"k", strings.Repeat("x", 15), strings.Repeat("y", 16), "\x00\x01", "\x01" + strings.Repeat("z", 13) + "\x01",
		store.CompactKey("s", "id"), "1~AAAAAAAAAAAAAAAAAAAAAB" /* pad bits set: not canonical */} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if key == "" {
			return // not a storage key
		}
		p := string(keypack.AppendKey(nil, key))
		if back := keypack.Key(p); back != key {
			t.Fatalf("key %q: packed %q reads back as %q", key, p, back)
		}
		if len(p) == 16 && !strings.HasPrefix(key, "1~") {
			t.Fatalf("key %q packs to 16 bytes", key)
		}
	})
}

// TestCompactKeyPacksTo16Bytes: a compact key's packed form is its digest.
func TestCompactKeyPacksTo16Bytes(t *testing.T) {
	if p := keypack.AppendKey(nil, store.CompactKey("s", "id")); len(p) != 16 {
		t.Fatalf("compact key packed: %d bytes", len(p))
	}
}

// FuzzFingerprint: a fingerprint survives its packing; idem.Fingerprint's
// packs to 17 bytes.
func FuzzFingerprint(f *testing.F) {
	for _, fp := range []string{"", "fp", idem.Fingerprint([]byte("body")), strings.ToUpper(idem.Fingerprint([]byte("body"))), "\x01"} {
		f.Add(fp)
	}
	f.Fuzz(func(t *testing.T, fp string) {
		p := keypack.Fingerprint(fp)
		if got := keypack.UnpackFingerprint(p); got != fp {
			t.Fatalf("fingerprint %q came back as %q", fp, got)
		}
		if a := keypack.AppendFingerprint([]byte("x"), fp); string(a) != "x"+p {
			t.Fatalf("fingerprint %q appended as %q, packed as %q", fp, a, p)
		}
	})
}

func TestDigestPacksTo17Bytes(t *testing.T) {
	if p := keypack.Fingerprint(idem.Fingerprint([]byte("body"))); len(p) != 17 {
		t.Fatalf("digest packed: %d bytes", len(p))
	}
}

// TestArgs: the statements' arguments are the packed forms, and read back.
func TestArgs(t *testing.T) {
	key, fp := store.CompactKey("s", "id"), idem.Fingerprint([]byte("body"))
	k, f := keypack.KeyArg(key), keypack.FingerprintArg(fp)
	if len(k) != 16 || len(f) != 17 || keypack.Key(string(k)) != key || keypack.UnpackFingerprint(string(f)) != fp {
		t.Fatalf("packed: key %x, fingerprint %x", k, f)
	}
	if c := keypack.CursorArg(""); c == nil || len(c) != 0 {
		t.Fatalf("cursor from the first key: %x", c)
	}
	if ks := keypack.KeysArg([]string{key, "k"}); len(ks) != 2 || keypack.Key(string(ks[1])) != "k" {
		t.Fatalf("packed keys: %x", ks)
	}
}
