// Package keyheader reads and writes the value of an Idempotency-Key header
// (draft-ietf-httpapi-idempotency-key-header): an RFC 8941 sf-string.
package keyheader

import (
	"errors"
	"fmt"
	"strings"
)

// Parse parses the value of an Idempotency-Key header. It accepts an RFC
// 8941 sf-string ("abc", with \" and \\ escapes) and, as Stripe's clients send
// it, a bare token (abc) of visible ASCII without quotes, commas, semicolons or
// backslashes; both forms of the same characters name the same key.
// Parameters, lists, empty keys and keys over maxLen bytes are errors.
func Parse(v string, maxLen int) (string, error) {
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

// Format renders key as an sf-string, the form senders put in the header.
func Format(key string) string {
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
