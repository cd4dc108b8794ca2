package edi

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Interchanges written by hand for the cases partners send.
const (
	edifactUNA = "UNA:+.? '" +
		"UNB+UNOC:3+5412345678908:14+8798765432106:14+260514:1032+00000000000778'" +
		"UNH+1+ORDERS:D:96A:UN:EAN008+ORD-20260514-0001'BGM+220+ORD-20260514-0001+9'DTM+137:20260514:102'" +
		"FTX+AAI+++DELIVER AT GATE ?+ DOCK 5?: ASK FOR ??'UNT+5+1'" +
		"UNZ+1+00000000000778'"
	edifactNoUNA = "UNB+UNOA:2+SENDER:ZZ+RECEIVER:ZZ+260514:1032+REF1'UNH+M1+INVOIC:D:96A:UN'BGM+380+INV1'UNT+3+M1'UNZ+1+REF1'"
	// Other service characters, syntax 4 (n8 date), a released release
	// character and a release before a non-service character, CRLF after
	// terminators and leading whitespace.
	edifactCustom = "UNA|^.#*!\r\n UNB^UNOC|4^SEN#^D|ZZ^REC^20260514|1032^A#^B##C#4!\r\n" +
		"UNH^1^DESADV|D|01B|UN!\r\n  BGM^351^X#!Y!UNT^3^1!\r\nUNZ^1^A#^B##C#4!\r\n"
	edifactGroups = "UNA:+.? 'UNB+UNOC:3+S+R+260514:1032+IC7'" +
		"UNG+ORDERS+S+R+260514:1032+G1+UN+D:96A'UNH+1+ORDERS:D:96A:UN'BGM+220+A+9'UNT+3+1'UNH+2+ORDERS:D:96A:UN'BGM+220+B+9'UNT+3+2'UNE+2+G1'" +
		"UNG+INVOIC+S+R+260514:1032+G2+UN+D:96A'UNH+3+INVOIC:D:96A:UN'BGM+380+C'UNT+3+3'UNE+1+G2'" +
		"UNZ+2+IC7'"
	x12Sample = "ISA*00*          *00*          *ZZ*SENDERID       *ZZ*RECEIVERID     *260514*1032*^*00501*000000905*0*T*:~\r\n" +
		"GS*PO*SENDERID*RECEIVERID*20260514*1032*905*X*005010~\r\n" +
		"ST*850*0001~BEG*00*SA*ORD-20260514-0001**20260514~PO1*1*10*EA*9.95**BP*ABC:1~SE*4*0001~\r\n" +
		"ST*850*0002~BEG*00*SA*ORD-20260514-0002**20260514~SE*3*0002~\r\n" +
		"GE*2*905~IEA*1*000000905~\r\n"
	// LF as the terminator, indented lines, version 00401 (ISA11 = U).
	x12LF = "ISA|00|          |00|          |01|123456789      |01|987654321      |260514|1032|U|00401|000000001|0|P|>\n" +
		"  GS|IN|A|B|20260514|1032|1|X|004010\n  ST|810|1001\n  BIG|20260514|INV1\n  SE|3|1001\n  GE|1|1\n  IEA|1|000000001\n"
)

func readOne(t *testing.T, s string) *Interchange {
	t.Helper()
	ics, err := ReadAll([]byte(s))
	if err != nil {
		t.Fatalf("ReadAll: %v", err)
	}
	if len(ics) != 1 {
		t.Fatalf("%d interchanges, want 1", len(ics))
	}
	return ics[0]
}

func TestReadValid(t *testing.T) {
	tests := []struct {
		name, in, key string
		groups, msgs  int
		check         func(t *testing.T, ic *Interchange)
	}{
		{"EDIFACT with UNA and released characters", edifactUNA, "EDIFACT|5412345678908|14|8798765432106|14|00000000000778", 0, 1,
			func(t *testing.T, ic *Interchange) {
				if ic.Messages[0].Reference != "ORD-20260514-0001" || ic.Messages[0].Segments != 5 || ic.Messages[0].Type != "ORDERS" {
					t.Errorf("message %+v", ic.Messages[0])
				}
			}},
		{"EDIFACT without UNA", edifactNoUNA, "EDIFACT|SENDER|ZZ|RECEIVER|ZZ|REF1", 0, 1, nil},
		{"EDIFACT custom service characters, syntax 4, CRLF", edifactCustom, "EDIFACT|SEN^D|ZZ|REC||A^B#C4", 0, 1,
			func(t *testing.T, ic *Interchange) {
				if ic.Delimiters.Element != '^' || ic.Delimiters.Release != '#' || ic.Delimiters.Segment != '!' || ic.Date != "20260514" {
					t.Errorf("delimiters %+v date %s", ic.Delimiters, ic.Date)
				}
			}},
		{"EDIFACT groups", edifactGroups, "EDIFACT|S||R||IC7", 2, 3, nil},
		{"X12 00501 with CRLF", x12Sample, "X12|ZZ|SENDERID|ZZ|RECEIVERID|000000905", 1, 2,
			func(t *testing.T, ic *Interchange) {
				if ic.Delimiters.Repetition != '^' || ic.Delimiters.Component != ':' || !ic.Test {
					t.Errorf("delimiters %+v test %v", ic.Delimiters, ic.Test)
				}
			}},
		{"X12 00401, LF terminator, indented", x12LF, "X12|01|123456789|01|987654321|000000001", 1, 1,
			func(t *testing.T, ic *Interchange) {
				if ic.Delimiters.Repetition != 0 || ic.Delimiters.Segment != '\n' {
					t.Errorf("delimiters %+v", ic.Delimiters)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ic := readOne(t, tt.in)
			if !ic.Valid() {
				t.Fatalf("errors: %v", ic.Errors)
			}
			if ic.Key() != tt.key {
				t.Errorf("key %q, want %q", ic.Key(), tt.key)
			}
			if len(ic.Groups) != tt.groups || ic.MessageCount() != tt.msgs {
				t.Errorf("groups %d messages %d, want %d and %d", len(ic.Groups), ic.MessageCount(), tt.groups, tt.msgs)
			}
			if tt.check != nil {
				tt.check(t, ic)
			}
		})
	}
}

func TestLevelBWithoutUNA(t *testing.T) {
	in := "UNB\x1dUNOB\x1f3\x1dS\x1dR\x1d260514\x1f1032\x1dX1\x1cUNH\x1d1\x1dORDERS\x1fD\x1f96A\x1fUN\x1cUNT\x1d2\x1d1\x1cUNZ\x1d1\x1dX1\x1c"
	ic := readOne(t, in)
	if !ic.Valid() || ic.Key() != "EDIFACT|S||R||X1" {
		t.Fatalf("%q %v", ic.Key(), ic.Errors)
	}
}

func TestSeveralInterchangesInOneFile(t *testing.T) {
	ics, err := ReadAll([]byte("\xef\xbb\xbf" + edifactUNA + "\n" + x12Sample + edifactNoUNA + "\r\n"))
	if err != nil || len(ics) != 3 {
		t.Fatalf("%d interchanges, %v", len(ics), err)
	}
	if ics[0].Standard != EDIFACT || ics[1].Standard != X12 || ics[2].Standard != EDIFACT {
		t.Fatalf("standards %s %s %s", ics[0].Standard, ics[1].Standard, ics[2].Standard)
	}
	if ics[1].Offset <= ics[0].Offset || ics[2].Offset <= ics[1].Offset {
		t.Fatalf("offsets %d %d %d", ics[0].Offset, ics[1].Offset, ics[2].Offset)
	}
}

func TestBrokenEnvelopesReportEveryProblem(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"EDIFACT: wrong trailer reference and counts, long 0020",
			"UNB+UNOC:3+S+R+260514:1032+REF-THAT-IS-TOO-LONG'UNH+1+ORDERS:D:96A:UN'BGM+220+A'UNT+9+2'UNZ+5+OTHER'",
			[]string{"0020", "is 20 characters", "UNT 0074 says \"9\"", "UNT 0062 \"2\" differs", "UNZ 0036 says \"5\"", "UNZ 0020 \"OTHER\" differs"}},
		{"EDIFACT: missing UNT and UNZ", "UNB+UNOC:3+S+R+260514:1032+R1'UNH+1+ORDERS:D:96A:UN'BGM+220+A'",
			[]string{"input ends before UNZ"}},
		{"EDIFACT: group counts", "UNB+UNOC:3+S+R+260514:1032+R1'UNG+ORDERS+S+R+260514:1032+G1+UN+D:96A'UNH+1+ORDERS:D:96A:UN'UNT+2+1'UNE+3+G9'UNZ+1+R1'",
			[]string{"UNE 0060 says \"3\"", "UNE 0048 \"G9\" differs"}},
		{"EDIFACT: bad date", "UNB+UNOC:3+S+R+2605:1032+R1'UNZ+0+R1'", []string{"date/time"}},
		{"X12: ISA13 not numeric, IEA mismatch, GE and SE counts",
			strings.Replace(x12Sample, "000000905*0*T", "00000090X*0*T", 1) + "",
			[]string{"ISA13 \"00000090X\"", "IEA02 \"000000905\" differs"}},
		{"X12: counts", strings.NewReplacer("SE*4*0001", "SE*7*0001", "GE*2*905", "GE*5*906", "IEA*1*", "IEA*2*").Replace(x12Sample),
			[]string{"SE01 says \"7\"", "GE01 says \"5\"", "GE02 \"906\" differs", "IEA01 says \"2\""}},
		{"X12: missing IEA", x12Sample[:strings.Index(x12Sample, "IEA")], []string{"input ends before IEA"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ic := readOne(t, tt.in)
			if ic.Valid() {
				t.Fatal("reported valid")
			}
			all := ""
			for _, e := range ic.Errors {
				var pe *Error
				if !errors.As(e, &pe) || pe.Offset < 0 {
					t.Errorf("error without a position: %v", e)
				}
				all += e.Error() + "\n"
			}
			for _, w := range tt.want {
				if !strings.Contains(all, w) {
					t.Errorf("missing %q in:\n%s", w, all)
				}
			}
		})
	}
}

func TestNotEDI(t *testing.T) {
	for _, in := range []string{"hello world", "<xml/>", "UNA:+", "ISA*00*short~", "UNB+UNOC:3+S+R+260514:1032+R1"} {
		_, err := ReadAll([]byte(in))
		var pe *Error
		if err == nil || !errors.As(err, &pe) {
			t.Errorf("%q: err = %v, want a positioned error", in, err)
		}
	}
	if _, err := ReadAll([]byte("just text")); !errors.Is(err, ErrNotEDI) {
		t.Errorf("plain text: %v, want ErrNotEDI", err)
	}
	if ics, err := ReadAll([]byte("  \n ")); err != nil || len(ics) != 0 {
		t.Errorf("blank input: %v %v", ics, err)
	}
}

func FuzzReadEDIFACT(f *testing.F) {
	for _, s := range []string{edifactUNA, edifactNoUNA, edifactCustom, edifactGroups, "UNA:+.? 'UNB'", "UNB+'"} {
		f.Add([]byte(s))
	}
	addRealSeeds(f, "UN")
	f.Fuzz(func(t *testing.T, b []byte) {
		ics, _ := ReadAll(b)
		for _, ic := range ics {
			_ = ic.Key()
			_ = ic.MessageCount()
		}
	})
}

func FuzzReadX12(f *testing.F) {
	for _, s := range []string{x12Sample, x12LF, "ISA*" + strings.Repeat("*", 102) + "~"} {
		f.Add([]byte(s))
	}
	addRealSeeds(f, "IS")
	f.Fuzz(func(t *testing.T, b []byte) {
		ics, _ := ReadAll(b)
		for _, ic := range ics {
			_ = ic.Key()
		}
	})
}

// TestX12InterchangeServiceSegments: ISB/ISE and TA1 belong between the ISA
// and the first GS, and an acknowledgment interchange may carry TA1s only
// (IEA01 = 0); after a GS they are misplaced. A final Ctrl-Z (a DOS
// end-of-file mark) after the last interchange is not an error.
func TestX12InterchangeServiceSegments(t *testing.T) {
	isa := "ISA*00*          *00*          *ZZ*0000BBB        *ZZ*00000AAA       *041214*1129*U*00401*412141129*1*P*:~"
	for _, tt := range []struct {
		name, body string
		problems   int
	}{
		{"TA1 only", isa + "TA1*000484889*040709*1339*R*015~IEA*0*412141129~", 0},
		{"ISB and ISE before GS", isa + "ISB*1~ISE*200601*0515*04~GS*FA*A*B*20050812*1953*5*X*004010~ST*997*0001~AK1*HC*1~SE*3*0001~GE*1*5~IEA*1*412141129~", 0},
		{"Ctrl-Z after the IEA", isa + "TA1*000484889*040709*1339*A*000~IEA*0*412141129~\r\n\x1a", 0},
		{"TA1 after a GS", isa + "GS*FA*A*B*20050812*1953*5*X*004010~TA1*000484889*040709*1339*R*015~GE*0*5~IEA*1*412141129~", 1},
	} {
		ics, err := ReadAll([]byte(tt.body))
		if err != nil || len(ics) != 1 {
			t.Fatalf("%s: %d interchanges, %v", tt.name, len(ics), err)
		}
		if got := len(ics[0].Errors); got != tt.problems {
			t.Errorf("%s: problems %v, want %d", tt.name, ics[0].Errors, tt.problems)
		}
	}
}

// addRealSeeds seeds f with the real interchanges of testdata/edi-real
// whose first bytes start with prefix.
func addRealSeeds(f *testing.F, prefix string) {
	files, _ := filepath.Glob(filepath.Join("testdata", "edi-real", "*.edi"))
	for _, file := range files {
		if b, err := os.ReadFile(file); err == nil && bytes.HasPrefix(bytes.TrimLeft(b, "\xef\xbb\xbf \r\n"), []byte(prefix)) {
			f.Add(b)
		}
	}
}

// An ISA's delimiters are bytes, whatever their value: a separator above
// 0x7F is read as that one byte.
func TestX12DelimiterAbove0x7F(t *testing.T) {
	in := strings.NewReplacer("*", "\xe9").Replace(x12Sample)
	ic := readOne(t, in)
	if ic.Delimiters.Element != 0xe9 || ic.Sender != "SENDERID" || ic.Control != "000000905" {
		t.Fatalf("element %q, sender %q, control %q", ic.Delimiters.Element, ic.Sender, ic.Control)
	}
	if len(ic.Groups) != 1 || len(ic.Groups[0].Messages) != 2 {
		t.Fatalf("groups %+v", ic.Groups)
	}
}
