package receiver

import (
	"bytes"
	"strings"
	"testing"

	"github.com/idemgo/idem/as2"
)

// FuzzSplit: whatever a partner's payload holds, the receiver either
// refuses it or delivers pieces that join to it byte for byte, each an
// interchange from a sender id the partner may use (or, where no envelope
// header starts anywhere, the payload whole).
func FuzzSplit(f *testing.F) {
	const x12 = "ISA*00*          *00*          *ZZ*BUYER          *ZZ*SUPPLIER       *260514*1032*^*00501*000000905*0*P*:~" +
		"GS*PO*BUYER*SUPPLIER*20260514*1032*905*X*005010~ST*850*0001~BEG*00*SA*ORD-1**20260514~SE*3*0001~GE*1*905~IEA*1*000000905~"
	const edifact = "UNB+UNOC:3+BUYER:14+SUPPLIER:14+260514:1032+905'UNH+1+ORDERS:D:96A:UN'BGM+220+ORD-1+9'UNT+3+1'UNZ+1+905'"
	for _, seed := range []string{x12, edifact, x12 + "~", "JUNK\n" + x12, x12 + x12, edifact + "'", "%PDF-1.7", "",
		strings.Replace(edifact, "UNH+1", "UNB+UNOC:3+OTHER:14+SUPPLIER:14+260514:1032+907'UNH+1", 1)} {
		f.Add([]byte(seed))
	}
	partner := &as2.Partner{AS2ID: "BUYER", EDISenders: []string{"BUYER"}}
	f.Fuzz(func(t *testing.T, payload []byte) {
		in := &as2.Incoming{From: "BUYER", MessageID: "m@buyer", Partner: partner, Payload: payload}
		ds, err := split(in)
		if err != nil {
			return
		}
		var joined []byte
		for _, d := range ds {
			joined = append(joined, d.Data...)
			if strings.HasPrefix(d.Key, "as2:") {
				if len(ds) != 1 || looksLikeEDI(payload) {
					t.Fatalf("delivered as not EDI: %q", payload)
				}
				continue
			}
			if f := strings.Split(d.Key, "|"); len(f) < 3 || (f[0] == "X12" && f[2] != "BUYER") || (f[0] == "EDIFACT" && f[1] != "BUYER") {
				t.Fatalf("an interchange of another sender delivered: %s", d.Key)
			}
		}
		if !bytes.Equal(joined, payload) {
			t.Fatalf("the pieces do not join to the payload")
		}
	})
}
