package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/idemgo/idem/store"
)

// Bounds of the key model. They are fixed so that every store agrees on
// what fits; the result size, lease and retention limits are per store.
const (
	// MaxScopeBytes bounds Key.Scope.
	MaxScopeBytes = 255
	// MaxIDBytes bounds Key.ID (the IETF draft and Stripe use 255).
	MaxIDBytes = 255
)

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

// Storage returns the string a store indexes for k: the raw form keeps the
// scope and id readable (store.RawKey), the compact form hashes them to 24
// bytes (store.CompactKey). Storage does not validate k.
func (k Key) Storage(compact bool) string {
	if compact {
		return store.CompactKey(k.Scope, k.ID)
	}
	return store.RawKey(k.Scope, k.ID)
}

// Fingerprint returns a request fingerprint: the hex SHA-256 of the parts,
// each length-prefixed so that ("ab","c") and ("a","bc") differ, truncated to
// 128 bits (32 hex characters). Same key with another fingerprint is a
// client error (store.Mismatch), never a replay.
func Fingerprint(parts ...[]byte) string {
	h := sha256.New()
	var n [20]byte
	for _, p := range parts {
		b := strconv.AppendUint(n[:0], uint64(len(p)), 10)
		b = append(b, ':')
		h.Write(b)
		h.Write(p)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return hex.EncodeToString(sum[:16])
}
