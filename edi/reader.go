package edi

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Standard names an EDI standard.
type Standard string

// The standards.
const (
	EDIFACT Standard = "EDIFACT"
	X12     Standard = "X12"
)

// Error is a problem at a byte offset of the input.
type Error struct {
	Offset int64
	// Segment is the 1-based segment number within the interchange (0 when
	// not inside one).
	Segment int
	Msg     string
}

func (e *Error) Error() string {
	if e.Segment > 0 {
		return fmt.Sprintf("offset %d (segment %d): %s", e.Offset, e.Segment, e.Msg)
	}
	return fmt.Sprintf("offset %d: %s", e.Offset, e.Msg)
}

// ErrNotEDI is wrapped by the error for input that is not an interchange at
// all (no UNA, UNB or ISA where one must start).
var ErrNotEDI = errors.New("edi: not an EDIFACT or X12 interchange")

// Delimiters of an interchange.
type Delimiters struct {
	Component, Element, Segment byte
	// Release is the EDIFACT release character; 0 when none.
	Release byte
	// Repetition is 0 when none.
	Repetition byte
	// Decimal is the EDIFACT decimal mark.
	Decimal byte
}

// DefaultEDIFACT are the level-A delimiters (UNA:+.? ').
var DefaultEDIFACT = Delimiters{Component: ':', Element: '+', Decimal: '.', Release: '?', Segment: '\''}

// Message is one EDIFACT message (UNH…UNT) or X12 transaction set (ST…SE).
type Message struct {
	Type    string // UNH S009 0065 or ST01
	Control string // UNH 0062 or ST02
	// Reference is UNH 0068 (the common access reference), if any.
	Reference string
	// Segments counts the message's segments, header and trailer included.
	Segments int
}

// Group is an EDIFACT UNG…UNE or X12 GS…GE group.
type Group struct {
	ID       string // UNG 0038 or GS01
	Control  string // UNG 0048 or GS06
	Messages []Message
}

// Interchange is one envelope with what the reader found in it.
type Interchange struct {
	Standard          Standard
	Sender            string // 0004 or ISA06 without trailing spaces
	SenderQualifier   string // S002 0007 or ISA05
	Receiver          string // 0010 or ISA08 without trailing spaces
	ReceiverQualifier string // S003 0007 or ISA07
	Control           string // 0020 (unescaped) or ISA13
	Syntax            string // UNB S001 (e.g. UNOC:3) or ISA12
	Date, Time        string // UNB S004 or ISA09/ISA10
	Test              bool   // UNB 0035 = 1, or ISA15 = T
	Delimiters        Delimiters
	// Groups holds the UNG/GS groups; messages outside any group are in
	// Messages.
	Groups   []Group
	Messages []Message
	// Offset is where the interchange starts in the input.
	Offset int64
	// Errors lists every envelope problem found; empty when valid.
	Errors []error
}

// Valid reports whether the envelope had no problem.
func (ic *Interchange) Valid() bool { return len(ic.Errors) == 0 }

// MessageCount counts the messages (UNH or ST) in the interchange.
func (ic *Interchange) MessageCount() int {
	n := len(ic.Messages)
	for _, g := range ic.Groups {
		n += len(g.Messages)
	}
	return n
}

// Key is the canonical inbound dedup key of the interchange:
//
//	EDIFACT|<0004>|<sender qualifier>|<0010>|<recipient qualifier>|<0020>
//	X12|<ISA05>|<ISA06>|<ISA07>|<ISA08>|<ISA13>
//
// (values unescaped, IDs without trailing spaces, an absent qualifier empty).
func (ic *Interchange) Key() string {
	if ic.Standard == X12 {
		return strings.Join([]string{"X12", ic.SenderQualifier, ic.Sender, ic.ReceiverQualifier, ic.Receiver, ic.Control}, "|")
	}
	return strings.Join([]string{"EDIFACT", ic.Sender, ic.SenderQualifier, ic.Receiver, ic.ReceiverQualifier, ic.Control}, "|")
}

// Reader streams interchanges.
type Reader struct {
	br  *bufio.Reader
	off int64 // offset of the next unread byte
	buf []byte
	// segment scratch
	elems [][]byte
	err   error
}

// NewReader reads interchanges from r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 64<<10)}
}

// ReadAll parses every interchange of data. A fatal error (input that
// cannot be read as EDI) stops it; envelope problems are in each
// interchange's Errors.
func ReadAll(data []byte) ([]*Interchange, error) {
	r := NewReader(bytes.NewReader(data))
	var out []*Interchange
	for {
		ic, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, ic)
	}
}

// skipSpace skips whitespace (and a UTF-8 BOM at the start) before a tag,
// and a final DOS end-of-file mark (Ctrl-Z) after the last interchange.
func (r *Reader) skipSpace() error {
	for {
		b, err := r.br.ReadByte()
		if err != nil {
			return err
		}
		if b == ' ' || b == '\r' || b == '\n' || b == '\t' {
			r.off++
			continue
		}
		if b == 0x1A {
			if _, err := r.br.Peek(1); err == io.EOF {
				r.off++
				return io.EOF
			}
		}
		if r.off == 0 && b == 0xEF {
			if bom, _ := r.br.Peek(2); len(bom) == 2 && bom[0] == 0xBB && bom[1] == 0xBF {
				r.br.Discard(2)
				r.off += 3
				continue
			}
		}
		return r.br.UnreadByte()
	}
}

// Next returns the next interchange, io.EOF at the end, or a fatal *Error.
func (r *Reader) Next() (*Interchange, error) {
	if r.err != nil {
		return nil, r.err
	}
	if err := r.skipSpace(); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, r.fail(&Error{Offset: r.off, Msg: err.Error()})
	}
	head, _ := r.br.Peek(3)
	switch string(head) {
	case "UNA", "UNB":
		return r.edifact()
	case "ISA":
		return r.x12()
	}
	return nil, r.fail(fmt.Errorf("%w: %w", ErrNotEDI, &Error{Offset: r.off, Msg: fmt.Sprintf("expected UNA, UNB or ISA, found %q", head)}))
}

func (r *Reader) fail(err error) error {
	r.err = err
	return err
}

// readSegment returns the next segment's bytes without its terminator,
// honouring the release character; the slice is valid until the next call.
// It skips whitespace after the terminator.
func (r *Reader) readSegment(d *Delimiters) (seg []byte, start int64, err error) {
	if err := r.skipSpace(); err != nil {
		return nil, r.off, err
	}
	start = r.off
	r.buf = r.buf[:0]
	for {
		chunk, err := r.br.ReadSlice(d.Segment)
		if err == bufio.ErrBufferFull {
			r.buf = append(r.buf, chunk...)
			r.off += int64(len(chunk))
			if len(r.buf) > maxSegment {
				return nil, start, &Error{Offset: start, Msg: fmt.Sprintf("segment longer than %d bytes (a wrong segment terminator?)", maxSegment)}
			}
			continue
		}
		if err != nil {
			r.buf = append(r.buf, chunk...)
			r.off += int64(len(chunk))
			if err == io.EOF {
				if len(bytes.TrimSpace(r.buf)) == 0 {
					return nil, start, io.EOF
				}
				return nil, start, &Error{Offset: start, Msg: "input ends inside a segment (no terminator)"}
			}
			return nil, start, err
		}
		r.off += int64(len(chunk))
		if len(r.buf) == 0 {
			seg = chunk[:len(chunk)-1]
		} else {
			r.buf = append(r.buf, chunk...)
			seg = r.buf[:len(r.buf)-1]
		}
		if d.Release != 0 && escaped(seg, d.Release) {
			// The terminator was released: it is data. Keep reading.
			if len(r.buf) == 0 {
				r.buf = append(r.buf, chunk...)
			}
			continue
		}
		return seg, start, nil
	}
}

const maxSegment = 1 << 20

// escaped reports whether the byte after seg is released: seg ends with an
// odd number of release characters.
func escaped(seg []byte, rel byte) bool {
	n := 0
	for i := len(seg) - 1; i >= 0 && seg[i] == rel; i-- {
		n++
	}
	return n%2 == 1
}

// split splits b on sep, honouring rel (0: none); the parts alias b.
func split(dst [][]byte, b []byte, sep, rel byte) [][]byte {
	dst = dst[:0]
	start := 0
	if rel == 0 {
		for {
			i := bytes.IndexByte(b[start:], sep)
			if i < 0 {
				return append(dst, b[start:])
			}
			dst = append(dst, b[start:start+i])
			start += i + 1
		}
	}
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case rel:
			i++
		case sep:
			dst = append(dst, b[start:i])
			start = i + 1
		}
	}
	return append(dst, b[start:])
}

// unescape drops release characters (a release before any character keeps
// that character: the lenient policy for a release before a non-service
// character, as StAEDI does).
func unescape(b []byte, rel byte) string {
	if rel == 0 || bytes.IndexByte(b, rel) < 0 {
		return string(b)
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] == rel && i+1 < len(b) {
			i++
		}
		out = append(out, b[i])
	}
	return string(out)
}

// component returns component c (0-based) of element e, unescaped.
func component(e []byte, d *Delimiters, c int) string {
	parts := split(nil, e, d.Component, d.Release)
	if c >= len(parts) {
		return ""
	}
	return unescape(parts[c], d.Release)
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func atoi(s string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	return n, err == nil
}

// KeyOf returns the dedup key of the first interchange in data, if data
// starts with a readable interchange.
func KeyOf(data []byte) (string, bool) {
	ic, err := NewReader(bytes.NewReader(data)).Next()
	if err != nil {
		return "", false
	}
	return ic.Key(), true
}
