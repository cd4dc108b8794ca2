package store

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

// Bounds of what a store indexes.
const (
	// MaxKeyBytes bounds a storage key: a scope of up to 255 bytes, the
	// separator and an id of up to 255 bytes (idem.MaxScopeBytes,
	// idem.MaxIDBytes).
	MaxKeyBytes = 255 + 1 + 255
	// MaxFingerprintBytes bounds a request fingerprint.
	MaxFingerprintBytes = 128
)

// scopeSep joins scope and id in the raw storage key. Control characters are
// refused in both, so the join is unambiguous.
const scopeSep = '\x1f'

// compactPrefix starts every compact storage key: the digit is the version of
// the canonical form that was hashed. A raw storage key always contains
// scopeSep, a compact one never does.
const compactPrefix = "1~"

// RawKey returns the raw storage key of scope and id: both joined by the
// unit separator (0x1F), readable and reversible with SplitKey.
func RawKey(scope, id string) string {
	return scope + string(scopeSep) + id
}

// CompactKey returns the compact storage key of scope and id: "1~" followed
// by the base64url (unpadded) SHA-256 of the canonical key, truncated to 128
// bits — 24 bytes whatever the key's length. The leading "1" versions the
// canonical form (len(scope) as decimal, ":", scope, id), so it can change
// later without colliding with keys stored today. The scope and id cannot be
// recovered from it.
func CompactKey(scope, id string) string {
	h := sha256.New()
	var n [20]byte
	h.Write(append(strconv.AppendUint(n[:0], uint64(len(scope)), 10), ':'))
	h.Write([]byte(scope))
	h.Write([]byte(id))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	out := make([]byte, len(compactPrefix)+base64.RawURLEncoding.EncodedLen(16))
	copy(out, compactPrefix)
	base64.RawURLEncoding.Encode(out[len(compactPrefix):], sum[:16])
	return string(out)
}

// SplitKey recovers scope and id from a raw storage key. For a compact
// storage key it returns ok=false: the hash cannot be reversed.
func SplitKey(key string) (scope, id string, ok bool) {
	return strings.Cut(key, string(scopeSep))
}

// DisplayKey renders a storage key for people: "scope/id" for a raw key
// ("id" when the scope is empty), the compact form unchanged.
func DisplayKey(key string) string {
	scope, id, ok := SplitKey(key)
	switch {
	case !ok:
		return key
	case scope == "":
		return id
	}
	return scope + "/" + id
}

// ValidateKey checks a storage key handed to a store directly: not empty
// and at most MaxKeyBytes. The error wraps ErrInvalidKey.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyBytes)
	}
	return nil
}
