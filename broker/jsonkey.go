package broker

import (
	"encoding/json"
	"errors"
	"fmt"
)

// JSONKey reads the id from a top-level string (or number) field of a JSON
// body. The body must be valid JSON; the field is found by one scan over it,
// without decoding the document. As with encoding/json, a field that occurs
// twice counts by its last occurrence, and names with escapes match their
// unescaped form. A number is returned as written; null, an empty string or
// any other value is an error.
func JSONKey(field string) KeyFunc {
	return func(m Message) (string, error) { return jsonField(m.Body(), field) }
}

var errNotObject = errors.New("idem/broker: the body is not a JSON object")

// jsonField returns the value of a top-level field of body.
func jsonField(body []byte, field string) (string, error) {
	if !json.Valid(body) {
		return "", fmt.Errorf("%w: invalid JSON", errNotObject)
	}
	i := skipSpace(body, 0)
	if body[i] != '{' {
		return "", errNotObject
	}
	i++
	var value []byte
	found := false
	for {
		i = skipSpace(body, i)
		if body[i] == '}' {
			break
		}
		end := skipString(body, i)
		name := body[i:end]
		i = skipSpace(body, end)
		i = skipSpace(body, i+1) // ':'
		vend := skipValue(body, i)
		if nameIs(name, field) {
			value, found = body[i:vend], true
		}
		i = skipSpace(body, vend)
		if body[i] == ',' {
			i++
		}
	}
	if !found {
		return "", fmt.Errorf("idem/broker: the body has no %q field", field)
	}
	switch c := value[0]; {
	case c == '"':
		if s := jsonString(value); s != "" {
			return s, nil
		}
	case c == '-' || c >= '0' && c <= '9':
		return string(value), nil
	}
	return "", fmt.Errorf("idem/broker: the %q field is not a non-empty string or a number", field)
}

// The scanners below assume valid JSON (checked first) and return the index
// just past what they skip.

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString skips the string starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	for i++; ; i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
}

func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// plain reports whether the quoted string q needs no unescaping or UTF-8
// repair: ASCII without backslashes.
func plain(q []byte) bool {
	for _, c := range q[1 : len(q)-1] {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

// jsonString returns the text of the quoted string q.
func jsonString(q []byte) string {
	if plain(q) {
		return string(q[1 : len(q)-1])
	}
	var s string
	_ = json.Unmarshal(q, &s) // q is valid JSON
	return s
}

func nameIs(q []byte, field string) bool {
	if plain(q) {
		return string(q[1:len(q)-1]) == field
	}
	return jsonString(q) == field
}
