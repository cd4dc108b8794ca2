// Package storedresp is the format in which httpidem's middleware and the
// gateway keep an HTTP response in a record's result, to replay it.
package storedresp

import (
	"encoding/binary"
	"errors"
	"net/http"
)

// A stored response is: the format version (1), the status as a uvarint, the
// number of header fields as a uvarint, each field's name and value as
// uvarint-length-prefixed strings, then the body to the end.
const storedVersion = 1

// Encode writes a response in the stored format.
func Encode(status int, h http.Header, body []byte) []byte {
	n := 1 + binary.MaxVarintLen64*2 + len(body)
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 2*binary.MaxVarintLen64
		}
	}
	out := make([]byte, 0, n)
	out = append(out, storedVersion)
	out = binary.AppendUvarint(out, uint64(status))
	count := 0
	for _, vs := range h {
		count += len(vs)
	}
	out = binary.AppendUvarint(out, uint64(count))
	for k, vs := range h {
		for _, v := range vs {
			out = binary.AppendUvarint(out, uint64(len(k)))
			out = append(out, k...)
			out = binary.AppendUvarint(out, uint64(len(v)))
			out = append(out, v...)
		}
	}
	return append(out, body...)
}

// ErrCorrupt is returned for a result that is not a stored response.
var ErrCorrupt = errors.New("idem/httpidem: stored response is corrupt")

// Decode reads a stored response; it fails on anything else.
func Decode(b []byte) (status int, h http.Header, body []byte, err error) {
	h = http.Header{}
	status, body, err = DecodeInto(b, h)
	if err != nil {
		return 0, nil, nil, err
	}
	return status, h, body, nil
}

// Field is a header field DecodeInto sets beside the stored ones: Name in
// its canonical form.
type Field struct{ Name, Value string }

// DecodeInto reads a stored response and, only if all of it is
// well formed, sets its header fields in dst (each replacing a field of
// that name), then the extra fields (each replacing one of that name, with
// one value), and returns its status and body. The stored fields' names and
// values share one string, and every field's slice one array: two
// allocations, whatever the number of fields.
func DecodeInto(b []byte, dst http.Header, extra ...Field) (status int, body []byte, err error) {
	if len(b) < 1 || b[0] != storedVersion {
		return 0, nil, ErrCorrupt
	}
	rest := b[1:]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(rest)
		if n <= 0 {
			return 0, false
		}
		rest = rest[n:]
		return v, true
	}
	st, ok := next()
	if !ok || st < 100 || st > 999 {
		return 0, nil, ErrCorrupt
	}
	count, ok := next()
	if !ok || count > uint64(len(rest)) {
		return 0, nil, ErrCorrupt
	}
	// First pass: check every field, without allocating.
	fields := rest
	for range 2 * count {
		l, ok := next()
		if !ok || l > uint64(len(rest)) {
			return 0, nil, ErrCorrupt
		}
		rest = rest[l:]
	}
	body = rest
	if count == 0 && len(extra) == 0 {
		return int(st), body, nil
	}
	values := make([]string, int(count)+len(extra))
	if count > 0 {
		setStored(fields[:len(fields)-len(body)], int(count), values, dst)
	}
	for j, f := range extra {
		i := int(count) + j
		values[i] = f.Value
		dst[f.Name] = values[i : i+1 : i+1]
	}
	return int(st), body, nil
}

// setStored sets in dst the count stored fields encoded in fields (checked
// well formed), their values in values[:count].
func setStored(fields []byte, count int, values []string, dst http.Header) {
	// The fields as substrings of one string.
	s := string(fields)
	at := 0
	str := func() string {
		l, n := binary.Uvarint(fields[at:])
		at += n + int(l)
		return s[at-int(l) : at]
	}
	prev, run := "", 0
	for i := range count {
		k, v := str(), str()
		values[i] = v
		if i == 0 || k != prev {
			prev, run = k, i // the encoder writes a field's values one after the other
		}
		dst[k] = values[run : i+1 : i+1]
	}
}
