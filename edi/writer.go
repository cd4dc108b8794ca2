package edi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Segment is one segment to write: a tag and its elements, each a list of
// components (write a simple element as a one-component list; E and C help).
type Segment struct {
	Tag      string
	Elements [][]string
}

// E builds a segment whose elements are simple (one component each).
func E(tag string, elements ...string) Segment {
	s := Segment{Tag: tag}
	for _, e := range elements {
		s.Elements = append(s.Elements, []string{e})
	}
	return s
}

// C builds a composite element for Segment.Elements.
func C(components ...string) []string { return components }

// Document is one message (EDIFACT) or transaction set (X12) to write.
type Document struct {
	// Type is the EDIFACT message identifier S009 (e.g. "ORDERS", "D",
	// "96A", "UN") or the X12 transaction set (e.g. "850").
	Type []string
	// Key is the business key. It is written to UNH 0068 (EDIFACT, up to 35
	// characters) and, when the body starts with BGM or BEG whose document
	// number is empty, to BGM 1004 or BEG03.
	Key string
	// Body is the segments between UNH/UNT or ST/SE.
	Body []Segment
}

// Profile is how a partner wants its interchanges.
type Profile struct {
	Standard Standard
	// Our and their identification and qualifiers (UNB S002/S003, ISA05–08).
	OurID, OurQualifier, TheirID, TheirQualifier string
	// Delimiters; the zero value means the standard's usual ones
	// (EDIFACT :+.? ' with * as repetition in syntax 4; X12 * : ~ with ^).
	Delimiters Delimiters
	// EDIFACT: syntax identifier (default UNOC) and version (3 or 4, default
	// 3); Groups wraps the messages in UNG/UNE.
	SyntaxID      string
	SyntaxVersion int
	Groups        bool
	// X12: ISA12 (default 00501), GS08 (default 005010), GS01 (default
	// derived from the transaction set: 850→PO, 810→IN, 856→SH, 997→FA),
	// GS02/GS03 (default our and their IDs).
	X12Version, GSVersion, FunctionalID, AppSender, AppReceiver string
	// Test marks the interchange as a test (UNB 0035 = 1, ISA15 = T).
	Test bool
	// LineEnd is written after every segment terminator (e.g. "\n"); empty
	// by default.
	LineEnd string
}

// Counter allocates persisted numbers: each call returns the next value of
// the named counter, in the caller's transaction.
type Counter func(ctx context.Context, name string) (int64, error)

// Controls are the control numbers an interchange was written with; they
// are stored with the rendered bytes and echoed by CONTRL, TA1 and 997.
type Controls struct {
	Interchange string   `json:"interchange"`
	Group       string   `json:"group,omitempty"`
	Messages    []string `json:"messages"`
}

func (p *Profile) defaults() error {
	switch p.Standard {
	case EDIFACT:
		if p.SyntaxID == "" {
			p.SyntaxID = "UNOC"
		}
		if p.SyntaxVersion == 0 {
			p.SyntaxVersion = 3
		}
		if p.SyntaxVersion != 3 && p.SyntaxVersion != 4 {
			return fmt.Errorf("edi: Profile.SyntaxVersion %d: want 3 or 4", p.SyntaxVersion)
		}
		if p.Delimiters == (Delimiters{}) {
			p.Delimiters = DefaultEDIFACT
			if p.SyntaxVersion == 4 {
				p.Delimiters.Repetition = '*'
			}
		}
	case X12:
		if p.X12Version == "" {
			p.X12Version = "00501"
		}
		if p.GSVersion == "" {
			p.GSVersion = "005010"
		}
		if p.Delimiters == (Delimiters{}) {
			p.Delimiters = Delimiters{Element: '*', Component: ':', Segment: '~', Repetition: '^'}
		}
		if p.AppSender == "" {
			p.AppSender = p.OurID
		}
		if p.AppReceiver == "" {
			p.AppReceiver = p.TheirID
		}
		if len(p.OurQualifier) != 2 || len(p.TheirQualifier) != 2 || len(p.OurID) > 15 || len(p.TheirID) > 15 || p.OurID == "" || p.TheirID == "" {
			return errors.New("edi: X12 needs 2-character qualifiers and IDs of 1 to 15 characters")
		}
	default:
		return fmt.Errorf("edi: Profile.Standard %q: want EDIFACT or X12", p.Standard)
	}
	if p.OurID == "" || p.TheirID == "" {
		return errors.New("edi: Profile.OurID and Profile.TheirID are required")
	}
	return nil
}

// counterName scopes counters per standard and partner pair, as X12.5's
// uniqueness tuple (ISA05–08) and EDIFACT's (S002, S003) require.
func (p *Profile) counterName(what string) string {
	return strings.Join([]string{"edi", string(p.Standard), p.OurQualifier, p.OurID, p.TheirQualifier, p.TheirID, what}, ":")
}

// Render writes an interchange around docs, allocating its control numbers
// from next (call it inside the transaction that records the business
// intent, so they are allocated once). now dates the envelope.
func Render(ctx context.Context, next Counter, p Profile, now time.Time, docs ...Document) ([]byte, Controls, error) {
	if err := p.defaults(); err != nil {
		return nil, Controls{}, err
	}
	if len(docs) == 0 {
		return nil, Controls{}, errors.New("edi: nothing to render")
	}
	icn, err := next(ctx, p.counterName("interchange"))
	if err != nil {
		return nil, Controls{}, err
	}
	ctl := Controls{Interchange: strconv.FormatInt(icn, 10)}
	w := &writer{d: p.Delimiters, lineEnd: p.LineEnd}
	if p.Standard == X12 {
		if icn < 1 || icn > 999_999_999 {
			return nil, Controls{}, fmt.Errorf("edi: interchange counter %d is outside ISA13's 1..999999999: roll it over per your partner agreement", icn)
		}
		ctl.Interchange = fmt.Sprintf("%09d", icn)
		gcn, err := next(ctx, p.counterName("group:"+p.functionalID(docs[0])))
		if err != nil {
			return nil, Controls{}, err
		}
		ctl.Group = strconv.FormatInt(gcn, 10)
		err = w.x12(&p, now, &ctl, docs)
		return w.buf.Bytes(), ctl, err
	}
	if len(ctl.Interchange) > 14 {
		return nil, Controls{}, fmt.Errorf("edi: interchange counter %d does not fit 0020 (an..14)", icn)
	}
	if p.Groups {
		gcn, err := next(ctx, p.counterName("group"))
		if err != nil {
			return nil, Controls{}, err
		}
		ctl.Group = strconv.FormatInt(gcn, 10)
	}
	err = w.edifact(&p, now, &ctl, docs)
	return w.buf.Bytes(), ctl, err
}

func (p *Profile) functionalID(d Document) string {
	if p.FunctionalID != "" {
		return p.FunctionalID
	}
	if len(d.Type) > 0 {
		if f, ok := map[string]string{"850": "PO", "810": "IN", "856": "SH", "997": "FA", "855": "PR", "860": "PC"}[d.Type[0]]; ok {
			return f
		}
	}
	return "PO"
}

type writer struct {
	buf     bytes.Buffer
	d       Delimiters
	lineEnd string
	count   int // segments of the current message
	err     error
}

// seg writes one segment, escaping (EDIFACT) or refusing (X12) service
// characters in the data.
func (w *writer) seg(s Segment) {
	w.buf.WriteString(s.Tag)
	for _, el := range s.Elements {
		w.buf.WriteByte(w.d.Element)
		for i, c := range el {
			if i > 0 {
				w.buf.WriteByte(w.d.Component)
			}
			w.value(c)
		}
	}
	w.buf.WriteByte(w.d.Segment)
	w.buf.WriteString(w.lineEnd)
	w.count++
}

func (w *writer) value(v string) {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == w.d.Element || c == w.d.Component || c == w.d.Segment || (c == w.d.Repetition && c != 0) || (c == w.d.Release && c != 0) {
			if w.d.Release == 0 {
				if w.err == nil {
					w.err = fmt.Errorf("edi: %q contains the delimiter %q and the standard has no release character", v, c)
				}
			} else {
				w.buf.WriteByte(w.d.Release)
			}
		}
		w.buf.WriteByte(c)
	}
}

// withKey puts the key into an empty BGM 1004 / BEG03.
func withKey(body []Segment, key string) []Segment {
	if key == "" || len(body) == 0 {
		return body
	}
	first := body[0]
	idx := map[string]int{"BGM": 1, "BEG": 2}[first.Tag]
	if idx == 0 {
		return body
	}
	els := append([][]string(nil), first.Elements...)
	for len(els) <= idx {
		els = append(els, []string{""})
	}
	if len(els[idx]) == 0 || els[idx][0] == "" {
		els[idx] = []string{key}
	}
	out := append([]Segment{{Tag: first.Tag, Elements: els}}, body[1:]...)
	return out
}

func (w *writer) edifact(p *Profile, now time.Time, ctl *Controls, docs []Document) error {
	d := w.d
	rep := d.Repetition
	if rep == 0 {
		rep = ' '
	}
	rel := d.Release
	if rel == 0 {
		rel = ' '
	}
	w.buf.Write([]byte{'U', 'N', 'A', d.Component, d.Element, d.Decimal, rel, rep, d.Segment})
	w.buf.WriteString(w.lineEnd)
	date := now.UTC().Format("060102")
	if p.SyntaxVersion == 4 {
		date = now.UTC().Format("20060102")
	}
	unb := Segment{Tag: "UNB", Elements: [][]string{
		{p.SyntaxID, strconv.Itoa(p.SyntaxVersion)},
		nonEmpty(p.OurID, p.OurQualifier), nonEmpty(p.TheirID, p.TheirQualifier),
		{date, now.UTC().Format("1504")},
		{ctl.Interchange},
	}}
	if p.Test {
		unb.Elements = append(unb.Elements, []string{""}, []string{""}, []string{""}, []string{""}, []string{""}, []string{"1"})
	}
	w.seg(unb)
	if p.Groups {
		w.seg(Segment{Tag: "UNG", Elements: [][]string{{docs[0].Type[0]}, nonEmpty(p.OurID, p.OurQualifier), nonEmpty(p.TheirID, p.TheirQualifier),
			{date, now.UTC().Format("1504")}, {ctl.Group}, {"UN"}, docs[0].Type[1:]}})
	}
	for i, doc := range docs {
		if len(doc.Type) == 0 {
			return errors.New("edi: Document.Type is required")
		}
		ref := strconv.Itoa(i + 1)
		ctl.Messages = append(ctl.Messages, ref)
		w.count = 0
		unh := Segment{Tag: "UNH", Elements: [][]string{{ref}, doc.Type}}
		if doc.Key != "" {
			if len([]rune(doc.Key)) > 35 {
				return fmt.Errorf("edi: key %q does not fit UNH 0068 (an..35)", doc.Key)
			}
			unh.Elements = append(unh.Elements, []string{doc.Key})
		}
		w.seg(unh)
		for _, s := range withKey(doc.Body, doc.Key) {
			w.seg(s)
		}
		w.seg(E("UNT", strconv.Itoa(w.count+1), ref))
	}
	count := len(docs)
	if p.Groups {
		w.seg(E("UNE", strconv.Itoa(len(docs)), ctl.Group))
		count = 1
	}
	w.seg(E("UNZ", strconv.Itoa(count), ctl.Interchange))
	return w.err
}

func nonEmpty(id, qual string) []string {
	if qual == "" {
		return []string{id}
	}
	return []string{id, qual}
}

func (w *writer) x12(p *Profile, now time.Time, ctl *Controls, docs []Document) error {
	d := w.d
	rep := "U"
	if p.X12Version >= "00402" && d.Repetition != 0 {
		rep = string([]byte{d.Repetition})
	}
	usage := "P"
	if p.Test {
		usage = "T"
	}
	e := string([]byte{d.Element})
	isa := strings.Join([]string{"ISA", "00", "          ", "00", "          ",
		p.OurQualifier, fmt.Sprintf("%-15s", p.OurID), p.TheirQualifier, fmt.Sprintf("%-15s", p.TheirID),
		now.UTC().Format("060102"), now.UTC().Format("1504"), rep, p.X12Version, ctl.Interchange, "0", usage, string([]byte{d.Component})}, e)
	w.buf.WriteString(isa)
	w.buf.WriteByte(d.Segment)
	w.buf.WriteString(w.lineEnd)
	w.seg(E("GS", p.functionalID(docs[0]), p.AppSender, p.AppReceiver, now.UTC().Format("20060102"), now.UTC().Format("1504"), ctl.Group, "X", p.GSVersion))
	for i, doc := range docs {
		if len(doc.Type) == 0 {
			return errors.New("edi: Document.Type is required")
		}
		ref := fmt.Sprintf("%04d", i+1)
		ctl.Messages = append(ctl.Messages, ref)
		w.count = 0
		w.seg(E("ST", doc.Type[0], ref))
		for _, s := range withKey(doc.Body, doc.Key) {
			w.seg(s)
		}
		w.seg(E("SE", strconv.Itoa(w.count+1), ref))
	}
	w.seg(E("GE", strconv.Itoa(len(docs)), ctl.Group))
	w.seg(E("IEA", "1", ctl.Interchange))
	return w.err
}

// ContentType is the MIME type of a standard's interchanges (RFC 1767).
func ContentType(s Standard) string {
	if s == X12 {
		return "application/EDI-X12"
	}
	return "application/EDIFACT"
}
