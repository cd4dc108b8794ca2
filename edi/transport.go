package edi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// atext reports whether c may stand in an RFC 2822 dot-atom.
func atext(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-/=?^_`{|}~", c) >= 0
}

// messageIDLeft turns a key into a stable RFC 2822 id-left: the key's
// characters where allowed, '-' elsewhere, plus a short hash of the key when
// anything was replaced (so two keys never map to one id).
func messageIDLeft(key string) string {
	var b strings.Builder
	changed := false
	prevDot := true
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case atext(c):
			b.WriteByte(c)
			prevDot = false
		case c == '.' && !prevDot && i < len(key)-1:
			b.WriteByte(c)
			prevDot = true
		default:
			b.WriteByte('-')
			changed = true
			prevDot = false
		}
	}
	if changed || b.Len() == 0 {
		sum := sha256.Sum256([]byte(key))
		b.WriteString("." + hex.EncodeToString(sum[:4]))
	}
	return b.String()
}

// AS4MessageID derives the eb:MessageId of an intent: "<key>@<host>" with no
// angle brackets (ebMS 3.0 §5.2.2.1), stable across retries.
func AS4MessageID(key, host string) string {
	return messageIDLeft(key) + "@" + host
}

// AS2MessageID derives the AS2 Message-ID of an intent: "<key@host>"
// (RFC 4130 §5.3.3), stable across retries — resend it only with identical
// content and Date, as the outbox does.
func AS2MessageID(key, host string) string {
	id := "<" + AS4MessageID(key, host) + ">"
	if len(id) > 255 {
		sum := sha256.Sum256([]byte(key))
		id = fmt.Sprintf("<%s.%s@%s>", messageIDLeft(key)[:100], hex.EncodeToString(sum[:8]), host)
	}
	return id
}
