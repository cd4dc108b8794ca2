package httpidem

import (
	"errors"
	"fmt"
	"strings"
)

// HeaderName is the request header that carries the key
// (draft-ietf-httpapi-idempotency-key-header).
const HeaderName = "Idempotency-Key"

// FenceHeader is the request header in which idem serve hands the upstream
// its request's fencing token (idem.FenceFrom), in decimal: each execution
// of a key gets a larger one than every execution before it, so an
// upstream that keeps the largest fence it applied per key, and refuses a
// write under a smaller one, refuses a gateway that lost its lease while
// frozen. In a handler behind the middleware, read idem.FenceFrom of the
// request's context instead.
const FenceHeader = "Idempotency-Fence"

// ParseKey parses the value of an Idempotency-Key header. It accepts an RFC
// 8941 sf-string ("abc", with \" and \\ escapes) and, as Stripe's clients send
// it, a bare token (abc) of visible ASCII without quotes, commas, semicolons or
// backslashes; both forms of the same characters name the same key.
// Parameters, lists, empty keys and keys over maxLen bytes are errors.
func ParseKey(v string, maxLen int) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", errors.New("the Idempotency-Key header is empty")
	}
	var key string
	if v[0] == '"' {
		var b strings.Builder
		i := 1
		closed := false
		for ; i < len(v); i++ {
			c := v[i]
			switch {
			case c == '\\':
				i++
				if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", errors.New(`the Idempotency-Key sf-string has a backslash not followed by " or \`)
				}
				b.WriteByte(v[i])
			case c == '"':
				closed = true
			case c < 0x20 || c > 0x7e:
				return "", fmt.Errorf("the Idempotency-Key sf-string has a character outside printable ASCII at byte %d", i)
			default:
				b.WriteByte(c)
			}
			if closed {
				break
			}
			if b.Len() > maxLen {
				return "", fmt.Errorf("the Idempotency-Key is longer than %d bytes", maxLen)
			}
		}
		if !closed {
			return "", errors.New("the Idempotency-Key sf-string has no closing quote")
		}
		if rest := v[i+1:]; rest != "" {
			return "", fmt.Errorf("the Idempotency-Key has %q after the string (parameters and lists are not accepted)", rest)
		}
		key = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c <= 0x20 || c >= 0x7f || c == '"' || c == ',' || c == ';' || c == '\\' {
				return "", fmt.Errorf("the Idempotency-Key has %q at byte %d: quote it as an sf-string or use visible ASCII only", c, i)
			}
		}
		key = v
	}
	if key == "" {
		return "", errors.New("the Idempotency-Key is an empty string")
	}
	if len(key) > maxLen {
		return "", fmt.Errorf("the Idempotency-Key is %d bytes, the limit is %d", len(key), maxLen)
	}
	return key, nil
}

// FormatKey renders key as an sf-string, the form senders put in the header.
func FormatKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 2)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}
