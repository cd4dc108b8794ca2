package as2

import (
	"errors"
	"fmt"
)

// berToDER re-encodes BER (as streaming CMS writers produce: indefinite
// lengths, constructed strings) with definite lengths, so encoding/asn1 can
// read it. Constructed strings stay constructed; readers of such a field
// take it as a RawValue and join the pieces (joinOctets).
func berToDER(ber []byte) ([]byte, error) {
	out, rest, err := berElement(ber, 0)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, errors.New("as2: trailing bytes after the BER structure")
	}
	return out, nil
}

// berElement converts the element at the start of b and returns it and
// what follows.
func berElement(b []byte, depth int) (der, rest []byte, err error) {
	if depth > 64 {
		return nil, nil, errors.New("as2: BER nested too deeply")
	}
	if len(b) < 2 {
		return nil, nil, errors.New("as2: truncated BER")
	}
	// Identifier: one byte, or more for tag numbers above 30.
	id := 1
	if b[0]&0x1f == 0x1f {
		for id < len(b) && b[id]&0x80 != 0 {
			id++
		}
		id++
		if id >= len(b) {
			return nil, nil, errors.New("as2: truncated BER tag")
		}
	}
	ident, constructed := b[:id], b[0]&0x20 != 0
	b = b[id:]
	if b[0] == 0x80 { // indefinite length: children until 00 00
		if !constructed {
			return nil, nil, errors.New("as2: an indefinite length on a primitive BER element")
		}
		b = b[1:]
		var content []byte
		for {
			if len(b) >= 2 && b[0] == 0 && b[1] == 0 {
				return encodeTLV(ident, content), b[2:], nil
			}
			var child []byte
			if child, b, err = berElement(b, depth+1); err != nil {
				return nil, nil, err
			}
			content = append(content, child...)
		}
	}
	n, body, err := berLength(b)
	if err != nil {
		return nil, nil, err
	}
	if n > len(body) {
		return nil, nil, fmt.Errorf("as2: a BER length of %d with %d bytes left", n, len(body))
	}
	content, rest := body[:n], body[n:]
	if !constructed {
		return encodeTLV(ident, content), rest, nil
	}
	var children []byte
	for len(content) > 0 {
		var child []byte
		if child, content, err = berElement(content, depth+1); err != nil {
			return nil, nil, err
		}
		children = append(children, child...)
	}
	return encodeTLV(ident, children), rest, nil
}

func berLength(b []byte) (int, []byte, error) {
	if b[0] < 0x80 {
		return int(b[0]), b[1:], nil
	}
	k := int(b[0] & 0x7f)
	if k == 0 || k > 4 || len(b) < 1+k {
		return 0, nil, errors.New("as2: a BER length that cannot be read")
	}
	n := 0
	for _, c := range b[1 : 1+k] {
		n = n<<8 | int(c)
	}
	if n < 0 {
		return 0, nil, errors.New("as2: a BER length that cannot be read")
	}
	return n, b[1+k:], nil
}

func encodeTLV(ident, content []byte) []byte {
	out := append([]byte(nil), ident...)
	switch n := len(content); {
	case n < 0x80:
		out = append(out, byte(n))
	case n < 0x100:
		out = append(out, 0x81, byte(n))
	case n < 0x10000:
		out = append(out, 0x82, byte(n>>8), byte(n))
	case n < 0x1000000:
		out = append(out, 0x83, byte(n>>16), byte(n>>8), byte(n))
	default:
		out = append(out, 0x84, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(out, content...)
}

// joinOctets returns the bytes of an OCTET STRING field read as a
// RawValue: its content when primitive, its pieces joined when
// constructed (streamed BER).
func joinOctets(v []byte, compound bool) ([]byte, error) {
	if !compound {
		return v, nil
	}
	var out []byte
	for len(v) > 0 {
		if len(v) < 2 {
			return nil, errors.New("as2: a broken constructed string")
		}
		constructed := v[0]&0x20 != 0
		n, body, err := berLength(v[1:])
		if err != nil || n > len(body) {
			return nil, errors.New("as2: a broken constructed string")
		}
		piece, err := joinOctets(body[:n], constructed)
		if err != nil {
			return nil, err
		}
		out = append(out, piece...)
		v = body[n:]
	}
	return out, nil
}
