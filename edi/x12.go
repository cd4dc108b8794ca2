package edi

import (
	"bytes"
	"fmt"
	"io"
	"strings"
)

// isaElementOffsets are where the element separator must appear in a
// fixed-width ISA.
var isaElementOffsets = []int{3, 6, 17, 20, 31, 34, 50, 53, 69, 76, 81, 83, 89, 99, 101, 103}

// x12 reads one X12 interchange, ISA to IEA.
func (r *Reader) x12() (*Interchange, error) {
	ic := &Interchange{Standard: X12, Offset: r.off}
	head, _ := r.br.Peek(106)
	if len(head) < 106 {
		return nil, r.fail(&Error{Offset: r.off, Msg: fmt.Sprintf("ISA is cut short: %d bytes, it needs 106", len(head))})
	}
	sep := head[3]
	var fields []string
	fixed := true
	for _, o := range isaElementOffsets {
		if head[o] != sep {
			fixed = false
			break
		}
	}
	d := &ic.Delimiters
	var isaLen int
	if fixed {
		d.Element, d.Component, d.Segment = sep, head[104], head[105]
		fields = strings.Split(string(head[:105]), string([]byte{sep}))
		isaLen = 106
	} else {
		// Nonconformant, unpadded ISA: split 16 elements; ISA16 is one
		// character and the terminator follows it.
		parts := bytes.SplitN(head, []byte{sep}, 17)
		if len(parts) < 17 || len(parts[16]) < 2 {
			return nil, r.fail(&Error{Offset: r.off, Msg: "the ISA has neither fixed widths nor 16 elements"})
		}
		for _, p := range parts[:16] {
			fields = append(fields, string(p))
		}
		fields = append(fields, string(parts[16][:1]))
		d.Element, d.Component, d.Segment = sep, parts[16][0], parts[16][1]
		isaLen = len(head) - len(parts[16]) + 2
		ic.Errors = append(ic.Errors, &Error{Offset: r.off, Segment: 1, Msg: "the ISA is not fixed-width (elements not padded)"})
	}
	start := r.off
	r.br.Discard(isaLen)
	r.off += int64(isaLen)
	segNo := 1
	problem := func(off int64, format string, args ...any) {
		ic.Errors = append(ic.Errors, &Error{Offset: off, Segment: segNo, Msg: fmt.Sprintf(format, args...)})
	}
	ic.SenderQualifier, ic.Sender = fields[5], strings.TrimRight(fields[6], " ")
	ic.ReceiverQualifier, ic.Receiver = fields[7], strings.TrimRight(fields[8], " ")
	ic.Date, ic.Time, ic.Syntax = fields[9], fields[10], fields[12]
	ic.Control = fields[13]
	ic.Test = fields[15] == "T"
	if ic.Syntax >= "00402" && !isAlnum(fields[11]) && len(fields[11]) == 1 {
		d.Repetition = fields[11][0]
	}
	if len(ic.Control) != 9 || !isDigits(ic.Control) {
		problem(start, "ISA13 %q is not exactly 9 digits", ic.Control)
	}
	if d.Segment == d.Element || d.Segment == d.Component || d.Element == d.Component {
		problem(start, "the ISA delimiters are not distinct")
	}
	var group *Group
	var msg *Message
	for {
		seg, start, err := r.readSegment(d)
		if err == io.EOF {
			problem(r.off, "input ends before IEA")
			return ic, nil
		}
		if err != nil {
			return nil, r.fail(err)
		}
		segNo++
		r.elems = split(r.elems, seg, d.Element, 0)
		el := r.elems
		get := func(i int) string {
			if i < len(el) {
				return string(el[i])
			}
			return ""
		}
		tag := string(el[0])
		if msg != nil {
			msg.Segments++
		}
		switch tag {
		case "GS":
			if group != nil {
				problem(start, "GS inside group %s (missing GE)", group.Control)
			}
			ic.Groups = append(ic.Groups, Group{ID: get(1), Control: get(6)})
			group = &ic.Groups[len(ic.Groups)-1]
			if c := group.Control; len(c) < 1 || len(c) > 9 || !isDigits(c) {
				problem(start, "GS06 %q is not 1 to 9 digits", c)
			}
		case "GE":
			if group == nil {
				problem(start, "GE without GS")
				break
			}
			if n, ok := atoi(get(1)); !ok || n != len(group.Messages) {
				problem(start, "GE01 says %q transaction sets, the group has %d", get(1), len(group.Messages))
			}
			if get(2) != group.Control {
				problem(start, "GE02 %q differs from GS06 %q", get(2), group.Control)
			}
			group = nil
		case "ST":
			if msg != nil {
				problem(start, "ST inside transaction set %s (missing SE)", msg.Control)
			}
			m := Message{Type: get(1), Control: get(2), Segments: 1}
			if c := m.Control; len(c) < 4 || len(c) > 9 {
				problem(start, "ST02 %q is not 4 to 9 characters", c)
			}
			if group == nil {
				problem(start, "ST outside a functional group")
				ic.Messages = append(ic.Messages, m)
				msg = &ic.Messages[len(ic.Messages)-1]
			} else {
				group.Messages = append(group.Messages, m)
				msg = &group.Messages[len(group.Messages)-1]
			}
		case "SE":
			if msg == nil {
				problem(start, "SE without ST")
				break
			}
			if n, ok := atoi(get(1)); !ok || n != msg.Segments {
				problem(start, "SE01 says %q segments, transaction set %s has %d", get(1), msg.Control, msg.Segments)
			}
			if get(2) != msg.Control {
				problem(start, "SE02 %q differs from ST02 %q", get(2), msg.Control)
			}
			msg = nil
		case "IEA":
			if msg != nil {
				problem(start, "IEA inside transaction set %s (missing SE)", msg.Control)
			}
			if group != nil {
				problem(start, "IEA inside group %s (missing GE)", group.Control)
			}
			if n, ok := atoi(get(1)); !ok || n != len(ic.Groups) {
				problem(start, "IEA01 says %q groups, the interchange has %d", get(1), len(ic.Groups))
			}
			if get(2) != ic.Control {
				problem(start, "IEA02 %q differs from ISA13 %q", get(2), ic.Control)
			}
			return ic, nil
		case "ISA":
			problem(start, "ISA inside an interchange (missing IEA)")
		case "ISB", "ISE", "TA1":
			// Interchange service segments (grade of service, deferred
			// delivery) and interchange acknowledgments belong between the
			// ISA and the first GS; an acknowledgment interchange may hold
			// TA1s and no group at all (IEA01 = 0).
			if msg != nil || group != nil || len(ic.Groups) > 0 {
				problem(start, "segment %s after the first GS (it belongs between ISA and GS)", tag)
			}
		default:
			if msg == nil {
				problem(start, "segment %s outside a transaction set", clip([]byte(tag)))
			}
		}
	}
}

func isAlnum(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return s != ""
}
