package edi

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// edifact reads one EDIFACT interchange, UNA (optional) to UNZ.
func (r *Reader) edifact() (*Interchange, error) {
	ic := &Interchange{Standard: EDIFACT, Offset: r.off, Delimiters: DefaultEDIFACT}
	d := &ic.Delimiters
	head, _ := r.br.Peek(9)
	if len(head) >= 3 && string(head[:3]) == "UNA" {
		if len(head) < 9 {
			return nil, r.fail(&Error{Offset: r.off, Msg: "UNA is cut short: it needs 6 service characters"})
		}
		d.Component, d.Element, d.Decimal, d.Release, d.Repetition, d.Segment = head[3], head[4], head[5], head[6], head[7], head[8]
		if d.Release == ' ' {
			d.Release = 0
		}
		if d.Repetition == ' ' {
			d.Repetition = 0
		}
		seen := map[byte]bool{}
		for _, c := range []byte{d.Component, d.Element, d.Release, d.Repetition, d.Segment} {
			if c != 0 && seen[c] {
				ic.Errors = append(ic.Errors, &Error{Offset: r.off, Msg: fmt.Sprintf("UNA uses %q for two service characters", c)})
			}
			seen[c] = true
		}
		r.br.Discard(9)
		r.off += 9
		if err := r.skipSpace(); err != nil {
			return nil, r.fail(&Error{Offset: r.off, Msg: "UNA is not followed by UNB"})
		}
	} else if p, _ := r.br.Peek(4); len(p) == 4 && p[3] == 0x1D {
		// Level B and up without UNA: IS4, IS3, IS1, no release character.
		*d = Delimiters{Component: 0x1F, Element: 0x1D, Segment: 0x1C, Repetition: 0x1E, Decimal: '.'}
	}
	segNo := 0
	var group *Group
	var msg *Message
	groups, messages := 0, 0
	problem := func(off int64, format string, args ...any) {
		ic.Errors = append(ic.Errors, &Error{Offset: off, Segment: segNo, Msg: fmt.Sprintf(format, args...)})
	}
	for {
		seg, start, err := r.readSegment(d)
		if err == io.EOF {
			problem(r.off, "input ends before UNZ")
			return ic, nil
		}
		if err != nil {
			return nil, r.fail(err)
		}
		segNo++
		r.elems = split(r.elems, seg, d.Element, d.Release)
		el := r.elems
		tag := string(el[0])
		get := func(i int) []byte {
			if i < len(el) {
				return el[i]
			}
			return nil
		}
		if segNo == 1 && tag != "UNB" {
			return nil, r.fail(fmt.Errorf("%w: %w", ErrNotEDI, &Error{Offset: start, Msg: fmt.Sprintf("expected UNB, found %q", clip(seg))}))
		}
		if msg != nil {
			msg.Segments++
		}
		switch tag {
		case "UNB":
			if segNo != 1 {
				// The envelope is the first UNB's: a second one names no
				// other sender or reference.
				problem(start, "UNB inside an interchange (missing UNZ)")
				continue
			}
			ic.Syntax = unescape(get(1), d.Release)
			ic.Sender, ic.SenderQualifier = component(get(2), d, 0), component(get(2), d, 1)
			ic.Receiver, ic.ReceiverQualifier = component(get(3), d, 0), component(get(3), d, 1)
			ic.Date, ic.Time = component(get(4), d, 0), component(get(4), d, 1)
			ic.Control = unescape(get(5), d.Release)
			ic.Test = unescape(get(11), d.Release) == "1"
			if component(get(1), d, 0) == "" {
				problem(start, "UNB S001 syntax identifier is missing")
			}
			if ic.Sender == "" || ic.Receiver == "" {
				problem(start, "UNB sender (0004) and recipient (0010) are mandatory")
			}
			if !(len(ic.Date) == 6 || len(ic.Date) == 8) || !isDigits(ic.Date) || len(ic.Time) != 4 || !isDigits(ic.Time) {
				problem(start, "UNB date/time %q:%q is not n6 or n8 and n4", ic.Date, ic.Time)
			}
			checkRef(problem, start, "UNB 0020", ic.Control)
		case "UNG":
			if group != nil {
				problem(start, "UNG inside group %s (missing UNE)", group.Control)
			}
			ic.Groups = append(ic.Groups, Group{ID: component(get(1), d, 0), Control: unescape(get(5), d.Release)})
			group = &ic.Groups[len(ic.Groups)-1]
			groups++
			checkRef(problem, start, "UNG 0048", group.Control)
		case "UNE":
			if group == nil {
				problem(start, "UNE without UNG")
				break
			}
			if n, ok := atoi(unescape(get(1), d.Release)); !ok || n != len(group.Messages) {
				problem(start, "UNE 0060 says %q messages, the group has %d", unescape(get(1), d.Release), len(group.Messages))
			}
			if ref := unescape(get(2), d.Release); ref != group.Control {
				problem(start, "UNE 0048 %q differs from UNG 0048 %q", ref, group.Control)
			}
			group = nil
		case "UNH":
			if msg != nil {
				problem(start, "UNH inside message %s (missing UNT)", msg.Control)
			}
			m := Message{Control: unescape(get(1), d.Release), Type: component(get(2), d, 0), Reference: unescape(get(3), d.Release), Segments: 1}
			checkRef(problem, start, "UNH 0062", m.Control)
			if group != nil {
				group.Messages = append(group.Messages, m)
				msg = &group.Messages[len(group.Messages)-1]
			} else {
				if len(ic.Groups) > 0 {
					problem(start, "message %s outside a group in an interchange with groups", m.Control)
				}
				ic.Messages = append(ic.Messages, m)
				msg = &ic.Messages[len(ic.Messages)-1]
			}
			messages++
		case "UNT":
			if msg == nil {
				problem(start, "UNT without UNH")
				break
			}
			if n, ok := atoi(unescape(get(1), d.Release)); !ok || n != msg.Segments {
				problem(start, "UNT 0074 says %q segments, message %s has %d", unescape(get(1), d.Release), msg.Control, msg.Segments)
			}
			if ref := unescape(get(2), d.Release); ref != msg.Control {
				problem(start, "UNT 0062 %q differs from UNH 0062 %q", ref, msg.Control)
			}
			msg = nil
		case "UNZ":
			if msg != nil {
				problem(start, "UNZ inside message %s (missing UNT)", msg.Control)
			}
			if group != nil {
				problem(start, "UNZ inside group %s (missing UNE)", group.Control)
			}
			want := messages
			if groups > 0 {
				want = groups
			}
			if n, ok := atoi(unescape(get(1), d.Release)); !ok || n != want {
				problem(start, "UNZ 0036 says %q, the interchange has %d %s", unescape(get(1), d.Release), want, map[bool]string{true: "groups", false: "messages"}[groups > 0])
			}
			if ref := unescape(get(2), d.Release); ref != ic.Control {
				problem(start, "UNZ 0020 %q differs from UNB 0020 %q", ref, ic.Control)
			}
			return ic, nil
		default:
			if msg == nil {
				problem(start, "segment %s outside a message", clip([]byte(tag)))
			}
		}
	}
}

// checkRef validates an an..14 control reference (after unescaping).
func checkRef(problem func(int64, string, ...any), off int64, name, v string) {
	switch n := utf8.RuneCountInString(v); {
	case n == 0:
		problem(off, "%s is empty", name)
	case n > 14:
		problem(off, "%s %q is %d characters, the limit is 14", name, v, n)
	}
}

func clip(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}
