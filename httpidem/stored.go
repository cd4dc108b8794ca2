package httpidem

import (
	"encoding/binary"
	"errors"
	"net/http"
)

// A stored response is: the format version (1), the status as a uvarint, the
// number of header fields as a uvarint, each field's name and value as
// uvarint-length-prefixed strings, then the body to the end.
const storedVersion = 1

func encodeResponse(status int, h http.Header, body []byte) []byte {
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

var errCorrupt = errors.New("idem/httpidem: stored response is corrupt")

// StoredResponse is a response as the middleware and the gateway keep it
// in a record's result, to replay it.
type StoredResponse struct {
	Status int
	Header http.Header
	Body   []byte
}

// DecodeStoredResponse reads a record's result written by the middleware
// or the gateway (for operators' tools: the console shows it). It fails on
// anything else.
func DecodeStoredResponse(result []byte) (StoredResponse, error) {
	status, h, body, err := decodeResponse(result)
	if err != nil {
		return StoredResponse{}, err
	}
	return StoredResponse{Status: status, Header: h, Body: body}, nil
}

func decodeResponse(b []byte) (status int, h http.Header, body []byte, err error) {
	if len(b) < 1 || b[0] != storedVersion {
		return 0, nil, nil, errCorrupt
	}
	b = b[1:]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	str := func() (string, bool) {
		l, ok := next()
		if !ok || l > uint64(len(b)) {
			return "", false
		}
		s := string(b[:l])
		b = b[l:]
		return s, true
	}
	st, ok := next()
	if !ok || st < 100 || st > 999 {
		return 0, nil, nil, errCorrupt
	}
	count, ok := next()
	if !ok || count > uint64(len(b)) {
		return 0, nil, nil, errCorrupt
	}
	h = make(http.Header, count)
	for range count {
		k, ok1 := str()
		v, ok2 := str()
		if !ok1 || !ok2 {
			return 0, nil, nil, errCorrupt
		}
		h[k] = append(h[k], v)
	}
	return int(st), h, b, nil
}
