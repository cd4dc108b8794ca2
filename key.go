package idem

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Bounds of the key model. They are fixed so that every backend agrees on
// what fits; the result size, lease and retention limits are per store (see
// [Limits]).
const (
	// MaxScopeBytes bounds Key.Scope.
	MaxScopeBytes = 255
	// MaxIDBytes bounds Key.ID (the IETF draft and Stripe use 255).
	MaxIDBytes = 255
	// MaxStorageKeyBytes bounds the string a store indexes.
	MaxStorageKeyBytes = MaxScopeBytes + 1 + MaxIDBytes
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

// Key identifies one business intent: the producer's id within a scope. The
// same id in two scopes is two keys, so one tenant can never replay another
// tenant's stored result.
//
// The ID must come from the producer (an order number, a payment instruction
// id, an Idempotency-Key header) — never a broker's message id, which changes
// when a message is replayed from a dead-letter queue or an archive.
type Key struct {
	// Scope names the consumer, route, tenant or principal. It may be empty.
	Scope string
	// ID is the producer's business id. It must not be empty.
	ID string
}

// NewKey returns a validated key.
func NewKey(scope, id string) (Key, error) {
	k := Key{Scope: scope, ID: id}
	return k, k.Validate()
}

// Validate reports whether the key fits the bounds: a non-empty ID of at most
// MaxIDBytes, a scope of at most MaxScopeBytes, both valid UTF-8 without
// control characters. The error wraps ErrInvalidKey and says what is wrong.
func (k Key) Validate() error {
	if k.ID == "" {
		return fmt.Errorf("%w: empty id", ErrInvalidKey)
	}
	if len(k.ID) > MaxIDBytes {
		return fmt.Errorf("%w: id is %d bytes, the limit is %d", ErrInvalidKey, len(k.ID), MaxIDBytes)
	}
	if len(k.Scope) > MaxScopeBytes {
		return fmt.Errorf("%w: scope is %d bytes, the limit is %d", ErrInvalidKey, len(k.Scope), MaxScopeBytes)
	}
	if err := checkText(k.ID); err != nil {
		return fmt.Errorf("%w: id %s", ErrInvalidKey, err)
	}
	if err := checkText(k.Scope); err != nil {
		return fmt.Errorf("%w: scope %s", ErrInvalidKey, err)
	}
	return nil
}

func checkText(s string) error {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("has a control character at byte %d", i)
		}
		if c >= utf8.RuneSelf {
			if !utf8.ValidString(s) {
				return fmt.Errorf("is not valid UTF-8")
			}
			return nil
		}
	}
	return nil
}

// String returns "scope/id", or "id" when the scope is empty; for logs.
func (k Key) String() string {
	if k.Scope == "" {
		return k.ID
	}
	return k.Scope + "/" + k.ID
}

// Storage returns the string a store indexes for k. The raw form keeps the
// scope and id readable (see [ParseStorageKey]); the compact form is
// [CompactKey]. Storage does not validate k.
func (k Key) Storage(compact bool) string {
	if compact {
		return CompactKey(k)
	}
	return k.Scope + string(scopeSep) + k.ID
}

// CompactKey returns the compact storage form of k: "1~" followed by the
// base64url (unpadded) SHA-256 of the canonical key, truncated to 128 bits —
// 24 bytes whatever the key's length. The leading "1" versions the canonical
// form (len(scope) as decimal, ":", scope, id), so it can change later without
// colliding with keys stored today. The raw key cannot be recovered from it.
func CompactKey(k Key) string {
	h := sha256.New()
	var n [20]byte
	b := appendUint(n[:0], uint64(len(k.Scope)))
	b = append(b, ':')
	h.Write(b)
	h.Write([]byte(k.Scope))
	h.Write([]byte(k.ID))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	out := make([]byte, len(compactPrefix)+base64.RawURLEncoding.EncodedLen(16))
	copy(out, compactPrefix)
	base64.RawURLEncoding.Encode(out[len(compactPrefix):], sum[:16])
	return string(out)
}

func appendUint(b []byte, v uint64) []byte {
	var tmp [20]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(b, tmp[i:]...)
}

// ParseStorageKey recovers the key from a raw storage key. For a compact
// storage key it returns ok=false: the hash cannot be reversed.
func ParseStorageKey(s string) (k Key, ok bool) {
	scope, id, found := strings.Cut(s, string(scopeSep))
	if !found {
		return Key{}, false
	}
	return Key{Scope: scope, ID: id}, true
}

// DisplayKey renders a storage key for people: "scope/id" for a raw key, the
// compact form unchanged.
func DisplayKey(storage string) string {
	if k, ok := ParseStorageKey(storage); ok {
		return k.String()
	}
	return storage
}

// ValidateStorageKey checks a storage key handed to a store directly: not
// empty and at most MaxStorageKeyBytes.
func ValidateStorageKey(s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(s) > MaxStorageKeyBytes {
		return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalidKey, len(s), MaxStorageKeyBytes)
	}
	return nil
}

// Fingerprint returns a request fingerprint: the hex SHA-256 of the parts,
// each length-prefixed so that ("ab","c") and ("a","bc") differ, truncated to
// 128 bits (32 hex characters). Same key with another fingerprint is a
// client error ([Mismatch]), never a replay.
func Fingerprint(parts ...[]byte) string {
	h := sha256.New()
	var n [20]byte
	for _, p := range parts {
		b := appendUint(n[:0], uint64(len(p)))
		b = append(b, ':')
		h.Write(b)
		h.Write(p)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return hex.EncodeToString(sum[:16])
}
