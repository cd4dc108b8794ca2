package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemgo/idem/store"
)

func TestStorageKeyForms(t *testing.T) {
	raw := store.RawKey("payments", "PAY-1")
	if scope, id, ok := store.SplitKey(raw); !ok || scope != "payments" || id != "PAY-1" {
		t.Fatalf("SplitKey(%q) = %q, %q, %v", raw, scope, id, ok)
	}
	for _, tt := range []struct{ key, display string }{
		{raw, "payments/PAY-1"},
		{store.RawKey("", "PAY-1"), "PAY-1"},
		{store.CompactKey("payments", "PAY-1"), store.CompactKey("payments", "PAY-1")},
	} {
		if got := store.DisplayKey(tt.key); got != tt.display {
			t.Errorf("DisplayKey(%q) = %q, want %q", tt.key, got, tt.display)
		}
	}
	if _, _, ok := store.SplitKey(store.CompactKey("payments", "PAY-1")); ok {
		t.Fatal("a compact key split as raw")
	}
	for _, bad := range []string{"", strings.Repeat("k", store.MaxKeyBytes+1)} {
		if err := store.ValidateKey(bad); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("ValidateKey of %d bytes: %v", len(bad), err)
		}
	}
	if err := store.ValidateKey(strings.Repeat("k", store.MaxKeyBytes)); err != nil {
		t.Fatal(err)
	}
}
