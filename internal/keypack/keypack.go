// Package keypack packs storage keys and fingerprints into the binary
// forms the stores keep: a compact key as its 16 bytes, a fingerprint of
// idem.Fingerprint's form as its 16 bytes. Each packing is one-to-one, so
// two keys (or fingerprints) never share a packed form and every packed
// form reads back as what was packed.
package keypack

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// compact decodes compact storage keys ("1~" and 22 base64url digits;
// Strict, so that each 16 bytes have one spelling only).
var compact = base64.RawURLEncoding.Strict()

// AppendKey appends the packed form of the storage key key to b: the 16
// bytes of a compact key (store.CompactKey); else 0 and the key, but 1, the
// key and 1 for a key of 15 bytes, so that no other key packs to 16 bytes.
func AppendKey(b []byte, key string) []byte {
	if len(key) == 24 && strings.HasPrefix(key, "1~") {
		var d [16]byte
		if n, err := compact.Decode(d[:], []byte(key[2:])); err == nil && n == 16 {
			return append(b, d[:]...)
		}
	}
	if len(key) == 15 {
		b = append(b, 1)
		b = append(b, key...)
		return append(b, 1)
	}
	b = append(b, 0)
	return append(b, key...)
}

// Key is the storage key packed as p by AppendKey ("" for a p that no key
// packs to).
func Key(p string) string {
	switch {
	case len(p) == 16:
		return "1~" + compact.EncodeToString([]byte(p))
	case len(p) == 17 && p[0] == 1:
		return p[1:16]
	case len(p) > 1 && p[0] == 0:
		return p[1:]
	}
	return ""
}

// Fingerprint packs fp: a 32-digit lowercase hex digest (idem.Fingerprint's
// form) as 1 and its 16 bytes, any other string as 0 and the string.
func Fingerprint(fp string) string {
	var b [17]byte
	if p := AppendFingerprint(b[:0], fp); len(p) == 17 && p[0] == 1 {
		return string(p)
	}
	return "\x00" + fp
}

// AppendFingerprint appends Fingerprint(fp) to b.
func AppendFingerprint(b []byte, fp string) []byte {
	if len(fp) == 32 && isLowerHex(fp) {
		if p, err := hex.AppendDecode(append(b, 1), []byte(fp)); err == nil {
			return p
		}
	}
	b = append(b, 0)
	return append(b, fp...)
}

// UnpackFingerprint is the fingerprint packed as p by Fingerprint ("" for
// "").
func UnpackFingerprint(p string) string {
	if len(p) == 17 && p[0] == 1 {
		return hex.EncodeToString([]byte(p[1:]))
	}
	if len(p) > 0 {
		return p[1:]
	}
	return ""
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// The SQL stores keep keys and fingerprints in binary columns holding
// AppendKey's and AppendFingerprint's forms. KeyArg, FingerprintArg,
// KeysArg, FingerprintsArg and CursorArg give their statements' arguments;
// Key and UnpackFingerprint read the columns back.

// KeyArg is the argument for a storage key: its packed form.
func KeyArg(k string) []byte { return AppendKey(nil, k) }

// FingerprintArg is the argument for a fingerprint: its packed form.
func FingerprintArg(fp string) []byte { return AppendFingerprint(nil, fp) }

// KeysArg and FingerprintsArg are the arguments for arrays of them.
func KeysArg(keys []string) [][]byte { return packAll(keys, AppendKey) }

func FingerprintsArg(fps []string) [][]byte { return packAll(fps, AppendFingerprint) }

func packAll(xs []string, pack func([]byte, string) []byte) [][]byte {
	out := make([][]byte, len(xs))
	for i, x := range xs {
		out[i] = pack(nil, x)
	}
	return out
}

// CursorArg is the argument for a key to page after: "" (from the first
// key: the empty bytes, below every packed key) or a storage key.
func CursorArg(after string) []byte {
	if after == "" {
		return []byte{}
	}
	return KeyArg(after)
}
