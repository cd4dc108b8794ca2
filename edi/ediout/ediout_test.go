package ediout_test

import (
	"bytes"
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemgo/idem/edi"
	"github.com/idemgo/idem/edi/ediout"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
)

func TestEnqueueTxRendersOncePerIntent(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "o.db")+"?_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ob, _ := outbox.New(databasesql.New(db, sqldriver.SQLite), outbox.Config{})
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	p := edi.Profile{Standard: edi.X12, OurID: "US", OurQualifier: "ZZ", TheirID: "THEM", TheirQualifier: "ZZ"}
	doc := edi.Document{Type: []string{"850"}, Key: "ORD-20260514-0001", Body: []edi.Segment{edi.E("BEG", "00", "SA", "", "", "20260514")}}
	enqueue := func(key string, when time.Time) edi.Controls {
		tx, _ := db.BeginTx(ctx, nil)
		defer tx.Commit()
		c, err := ediout.EnqueueTx(ctx, ob, tx, p, key, "as2+http://partner/as2?from=US&to=THEM", when, doc)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1 := enqueue("ORD-20260514-0001", time.Now())
	first, _ := ob.Get(ctx, "ORD-20260514-0001")
	// The application retries its own step (a crash before it saw the
	// commit): nothing is allocated again, the bytes are the same.
	c2 := enqueue("ORD-20260514-0001", time.Now().Add(time.Hour))
	again, _ := ob.Get(ctx, "ORD-20260514-0001")
	if c1.Interchange != c2.Interchange || !bytes.Equal(first.Payload, again.Payload) {
		t.Fatalf("re-enqueue changed the interchange: %+v %+v", c1, c2)
	}
	if c3 := enqueue("ORD-20260514-0002", time.Now()); c3.Interchange != "000000002" {
		t.Fatalf("next intent got %s, want 000000002", c3.Interchange)
	}
	ic, err := edi.ReadAll(first.Payload)
	if err != nil || len(ic) != 1 || !ic[0].Valid() || ic[0].Control != c1.Interchange {
		t.Fatalf("stored bytes: %v %v", ic, err)
	}
	if first.Headers["Content-Type"] != "application/EDI-X12" || first.Headers["Date"] == "" {
		t.Fatalf("headers %v", first.Headers)
	}
}
