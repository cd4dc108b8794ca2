package idem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

func TestKeyValidate(t *testing.T) {
	tests := []struct {
		name    string
		key     idem.Key
		wantErr bool
	}{
		{"plain", idem.Key{Scope: "orders", ID: "ORD-1"}, false},
		{"no scope", idem.Key{ID: "x"}, false},
		{"unicode", idem.Key{Scope: "tenant-é", ID: "ключ"}, false},
		{"max id", idem.Key{ID: strings.Repeat("a", idem.MaxIDBytes)}, false},
		{"empty id", idem.Key{Scope: "s"}, true},
		{"10KB id", idem.Key{ID: strings.Repeat("a", 10<<10)}, true},
		{"long scope", idem.Key{Scope: strings.Repeat("s", idem.MaxScopeBytes+1), ID: "x"}, true},
		{"control char", idem.Key{ID: "a\nb"}, true},
		{"separator in scope", idem.Key{Scope: "a\x1fb", ID: "c"}, true},
		{"bad utf8", idem.Key{ID: "\xff\xfe"}, true},
	}
	for _, tt := range tests {
		err := tt.key.Validate()
		if (err != nil) != tt.wantErr {
			t.Errorf("%s: Validate() = %v, wantErr %v", tt.name, err, tt.wantErr)
		}
		if err != nil && !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("%s: %v does not wrap ErrInvalidKey", tt.name, err)
		}
	}
}

func TestStorageKeys(t *testing.T) {
	k := idem.Key{Scope: "payments", ID: "PAY-1"}
	raw := k.Storage(false)
	scope, id, ok := store.SplitKey(raw)
	if back := (idem.Key{Scope: scope, ID: id}); !ok || back != k {
		t.Fatalf("SplitKey(%q) = %v, %v", raw, back, ok)
	}
	if got := store.DisplayKey(raw); got != "payments/PAY-1" {
		t.Fatalf("DisplayKey = %q", got)
	}
	c := k.Storage(true)
	// The compact form is stable across releases: stored keys depend on it.
	if c != "1~"+c[2:] || len(c) != 24 {
		t.Fatalf("compact key %q", c)
	}
	if c != store.CompactKey("payments", "PAY-1") {
		t.Fatal("compact key is not deterministic")
	}
	if store.CompactKey("pay", "mentsPAY-1") == c {
		t.Fatal("scope/id boundary is not part of the compact key")
	}
	if _, _, ok := store.SplitKey(c); ok {
		t.Fatal("a compact key parsed as raw")
	}
	if got, want := store.CompactKey("s", "id"), "1~"; got[:2] != want {
		t.Fatalf("version prefix %q", got)
	}
}

func TestCompactKeyGolden(t *testing.T) {
	// sha256("1:s" + "id")[:16], base64url. Changing this breaks every stored
	// compact key: bump the version prefix instead.
	if got := store.CompactKey("s", "id"); got != "1~"+goldenCompact {
		t.Fatalf("CompactKey = %q, want 1~%s", got, goldenCompact)
	}
}

func TestFingerprint(t *testing.T) {
	a := idem.Fingerprint([]byte("ab"), []byte("c"))
	b := idem.Fingerprint([]byte("a"), []byte("bc"))
	if a == b {
		t.Fatal("part boundaries are not part of the fingerprint")
	}
	if len(a) != 32 || a != idem.Fingerprint([]byte("ab"), []byte("c")) {
		t.Fatalf("fingerprint %q", a)
	}
}

func FuzzKey(f *testing.F) {
	f.Add("orders", "ORD-1")
	f.Add("", "\x1f")
	f.Add("a\x00", "é")
	f.Fuzz(func(t *testing.T, scope, id string) {
		k := idem.Key{Scope: scope, ID: id}
		if err := k.Validate(); err != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("error %v does not wrap ErrInvalidKey", err)
			}
			return
		}
		scope, id, ok := store.SplitKey(k.Storage(false))
		if back := (idem.Key{Scope: scope, ID: id}); !ok || back != k {
			t.Fatalf("raw storage key does not round-trip: %+v → %+v", k, back)
		}
		if err := store.ValidateKey(k.Storage(false)); err != nil {
			t.Fatalf("a valid key's storage form is refused: %v", err)
		}
		if c := k.Storage(true); len(c) != 24 {
			t.Fatalf("compact key length %d", len(c))
		}
	})
}
