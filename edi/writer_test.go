package edi

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// memCounter is an in-memory Counter for render tests (the persisted one is
// outbox.Store.NextCounterTx, tested with the outbox).
func memCounter() Counter {
	m := map[string]int64{}
	return func(_ context.Context, name string) (int64, error) { m[name]++; return m[name], nil }
}

var when = time.Date(2026, 5, 14, 10, 32, 0, 0, time.UTC)

func orders(key string) Document {
	return Document{Type: []string{"ORDERS", "D", "96A", "UN"}, Key: key, Body: []Segment{
		E("BGM", "220", "", "9"),
		{Tag: "DTM", Elements: [][]string{C("137", "20260514", "102")}},
		E("FTX", "AAI", "", "", "GATE 5+6: ASK FOR ?JOE'S? DESK"),
	}}
}

func TestRenderEDIFACTRoundTrip(t *testing.T) {
	for _, version := range []int{3, 4} {
		p := Profile{Standard: EDIFACT, OurID: "5412345678908", OurQualifier: "14", TheirID: "8798765432106", TheirQualifier: "14",
			SyntaxVersion: version, Groups: version == 4, LineEnd: "\n", Test: true}
		next := memCounter()
		b, ctl, err := Render(context.Background(), next, p, when, orders("ORD-20260514-0001"), orders("ORD-20260514-0002"))
		if err != nil {
			t.Fatal(err)
		}
		ic := readOne(t, string(b))
		if !ic.Valid() {
			t.Fatalf("v%d: invalid: %v\n%s", version, ic.Errors, b)
		}
		wantKey := "EDIFACT|5412345678908|14|8798765432106|14|" + ctl.Interchange
		if ic.Key() != wantKey || ic.MessageCount() != 2 || !ic.Test {
			t.Fatalf("v%d: key %q messages %d test %v", version, ic.Key(), ic.MessageCount(), ic.Test)
		}
		msgs := ic.Messages
		if version == 4 {
			msgs = ic.Groups[0].Messages
			if ic.Groups[0].Control != ctl.Group || len(ic.Date) != 8 {
				t.Fatalf("group %+v date %s", ic.Groups[0], ic.Date)
			}
		}
		if msgs[0].Reference != "ORD-20260514-0001" || msgs[1].Control != ctl.Messages[1] {
			t.Fatalf("messages %+v controls %+v", msgs, ctl)
		}
		if !bytes.Contains(b, []byte("BGM+220+ORD-20260514-0001+9")) {
			t.Fatalf("the key is not in BGM:\n%s", b)
		}
		if !bytes.Contains(b, []byte("GATE 5?+6?: ASK FOR ??JOE?'S?? DESK")) {
			t.Fatalf("data not escaped:\n%s", b)
		}
		// The next intent gets the next interchange number.
		_, ctl2, _ := Render(context.Background(), next, p, when, orders("ORD-3"))
		if ctl2.Interchange != "2" {
			t.Fatalf("second interchange number %s", ctl2.Interchange)
		}
	}
}

func TestRenderX12RoundTrip(t *testing.T) {
	p := Profile{Standard: X12, OurID: "SENDERID", OurQualifier: "ZZ", TheirID: "RECEIVERID", TheirQualifier: "ZZ", LineEnd: "\r\n"}
	doc := Document{Type: []string{"850"}, Key: "ORD-20260514-0001", Body: []Segment{
		E("BEG", "00", "SA", "", "", "20260514"), E("PO1", "1", "10", "EA", "9.95", "", "BP", "ABC-1"),
	}}
	b, ctl, err := Render(context.Background(), memCounter(), p, when, doc, doc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("ISA*00*          *00*          *ZZ*SENDERID       *ZZ*RECEIVERID     *260514*1032*^*00501*000000001*0*P*:~")) {
		t.Fatalf("ISA:\n%s", b[:110])
	}
	ic := readOne(t, string(b))
	if !ic.Valid() || ic.Key() != "X12|ZZ|SENDERID|ZZ|RECEIVERID|000000001" || ic.MessageCount() != 2 || ic.Groups[0].ID != "PO" {
		t.Fatalf("read back: %q %v %+v", ic.Key(), ic.Errors, ic.Groups)
	}
	if ctl.Interchange != "000000001" || ctl.Messages[1] != "0002" || !bytes.Contains(b, []byte("BEG*00*SA*ORD-20260514-0001**20260514~")) {
		t.Fatalf("controls %+v\n%s", ctl, b)
	}
	// X12 has no release character: a delimiter in data is refused.
	bad := Document{Type: []string{"850"}, Body: []Segment{E("BEG", "00", "SA", "A*B")}}
	if _, _, err := Render(context.Background(), memCounter(), p, when, bad); err == nil {
		t.Fatal("a delimiter in X12 data was written")
	}
}

func TestRenderRefusesWhatDoesNotFit(t *testing.T) {
	p := Profile{Standard: EDIFACT, OurID: "S", TheirID: "R"}
	long := orders(strings.Repeat("K", 36))
	if _, _, err := Render(context.Background(), memCounter(), p, when, long); err == nil {
		t.Fatal("a 36-character key went into UNH 0068")
	}
	big := func(context.Context, string) (int64, error) { return 1_000_000_000, nil }
	if _, _, err := Render(context.Background(), big, Profile{Standard: X12, OurID: "A", OurQualifier: "ZZ", TheirID: "B", TheirQualifier: "ZZ"}, when,
		Document{Type: []string{"850"}}); err == nil {
		t.Fatal("ISA13 over 9 digits accepted")
	}
	if _, _, err := Render(context.Background(), memCounter(), Profile{Standard: "EANCOM"}, when); err == nil {
		t.Fatal("unknown standard accepted")
	}
}

func TestTransportIDs(t *testing.T) {
	tests := []struct{ key, as2 string }{
		{"ORD-20260514-0001", "<ORD-20260514-0001@as2.example.com>"},
		{"ORD 1/2", "<ORD-1/2.5e1b5e1a@as2.example.com>"},
	}
	for _, tt := range tests {
		got := AS2MessageID(tt.key, "as2.example.com")
		if tt.key == "ORD-20260514-0001" && got != tt.as2 {
			t.Errorf("AS2MessageID(%q) = %q, want %q", tt.key, got, tt.as2)
		}
		if got != AS2MessageID(tt.key, "as2.example.com") {
			t.Error("not stable")
		}
		as4 := AS4MessageID(tt.key, "ap.example.com")
		if strings.ContainsAny(as4, "<> ") || !strings.HasSuffix(as4, "@ap.example.com") {
			t.Errorf("AS4MessageID(%q) = %q", tt.key, as4)
		}
	}
	if AS2MessageID("A B", "h") == AS2MessageID("A-B", "h") {
		t.Fatal("two keys share a Message-ID")
	}
	if id := AS2MessageID(strings.Repeat("k", 300), "h"); len(id) > 255 {
		t.Fatalf("Message-ID of %d characters", len(id))
	}
}

// BenchmarkReadX12 reads a large X12 file (about 20 MB of 850s) and reports
// MB/s.
func BenchmarkReadX12(b *testing.B) {
	var body bytes.Buffer
	p := Profile{Standard: X12, OurID: "SENDERID", OurQualifier: "ZZ", TheirID: "RECEIVERID", TheirQualifier: "ZZ", LineEnd: "\n"}
	next := memCounter()
	for body.Len() < 20<<20 {
		var docs []Document
		for i := range 100 {
			segs := []Segment{E("BEG", "00", "SA", fmt.Sprintf("ORD-%d", i), "", "20260514")}
			for l := range 20 {
				segs = append(segs, E("PO1", fmt.Sprint(l+1), "10", "EA", "9.95", "", "BP", fmt.Sprintf("SKU-%05d", l)))
			}
			docs = append(docs, Document{Type: []string{"850"}, Body: segs})
		}
		ic, _, err := Render(context.Background(), next, p, when, docs...)
		if err != nil {
			b.Fatal(err)
		}
		body.Write(ic)
	}
	data := body.Bytes()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		r := NewReader(bytes.NewReader(data))
		n := 0
		for {
			ic, err := r.Next()
			if err != nil {
				break
			}
			if !ic.Valid() {
				b.Fatal(ic.Errors)
			}
			n++
		}
		if n == 0 {
			b.Fatal("nothing read")
		}
	}
}

// A delimiter above 0x7F is written as that one byte, so the ISA keeps its
// fixed widths and reads back.
func TestRenderX12DelimiterAbove0x7F(t *testing.T) {
	p := Profile{Standard: X12, OurID: "SENDERID", OurQualifier: "ZZ", TheirID: "RECEIVERID", TheirQualifier: "ZZ",
		Delimiters: Delimiters{Element: 0xe9, Component: 0xfe, Segment: '~', Repetition: 0xa6}}
	b, _, err := Render(context.Background(), memCounter(), p, when, Document{Type: []string{"850"}, Body: []Segment{E("BEG", "00", "SA", "K1")}})
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexByte(b, '~'); i != 105 {
		t.Fatalf("the ISA is %d bytes, want 105 before its terminator:\n%q", i, b)
	}
	ic := readOne(t, string(b))
	if !ic.Valid() || ic.Delimiters != p.Delimiters {
		t.Fatalf("read back: %v %+v", ic.Errors, ic.Delimiters)
	}
}
