package edi_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgo/idem/edi"
)

func ExampleRender() {
	counters := map[string]int64{} // in production: outbox.Store.NextCounterTx in the intent's transaction
	next := func(_ context.Context, name string) (int64, error) { counters[name]++; return counters[name], nil }
	p := edi.Profile{Standard: edi.EDIFACT, OurID: "5412345678908", OurQualifier: "14", TheirID: "8798765432106", TheirQualifier: "14", LineEnd: "\n"}
	b, ctl, err := edi.Render(context.Background(), next, p, time.Date(2026, 5, 14, 10, 32, 0, 0, time.UTC), edi.Document{
		Type: []string{"ORDERS", "D", "96A", "UN"}, Key: "ORD-20260514-0001",
		Body: []edi.Segment{edi.E("BGM", "220", "", "9"), edi.E("FTX", "AAI", "", "", "GATE 5+6")},
	})
	if err != nil {
		panic(err)
	}
	fmt.Print(string(b))
	ics, _ := edi.ReadAll(b)
	fmt.Println(ctl.Interchange, ics[0].Key(), ics[0].Valid())
	// Output:
	// UNA:+.? '
	// UNB+UNOC:3+5412345678908:14+8798765432106:14+260514:1032+1'
	// UNH+1+ORDERS:D:96A:UN+ORD-20260514-0001'
	// BGM+220+ORD-20260514-0001+9'
	// FTX+AAI+++GATE 5?+6'
	// UNT+4+1'
	// UNZ+1+1'
	// 1 EDIFACT|5412345678908|14|8798765432106|14|1 true
}
