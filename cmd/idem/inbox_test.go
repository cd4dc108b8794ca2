package main

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
)

// TestInboxCommands: idem inbox ls pages through every processed key (in
// key order, per consumer on request, hostile ids quoted) and idem inbox
// sweep deletes only keys older than asked — on SQLite and on MySQL.
func TestInboxCommands(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "app.db")
		// The fixture's 1,204 keys need no fsync each: synchronous(OFF).
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(OFF)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		inboxCommands(t, databasesql.New(db, sqldriver.SQLite), "sqlite:"+path)
	})
	t.Run("mysql", func(t *testing.T) {
		loc := testenv.MySQLDatabase(t, "")
		inboxCommands(t, databasesql.New(testenv.OpenMySQL(t, loc), sqldriver.MySQL), loc)
	})
}

func inboxCommands(t *testing.T, driver sqldriver.Driver[*sql.Tx], store string) {
	ib, err := inbox.New(driver, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var items []inbox.BatchItem[*sql.Tx]
	nothing := func(context.Context, *sql.Tx) error { return nil }
	for i := range 1203 {
		consumer := "payments"
		if i%3 == 0 {
			consumer = "refunds"
		}
		items = append(items, inbox.BatchItem[*sql.Tx]{Event: inbox.Event{Consumer: consumer, CorrelationID: fmt.Sprintf("PAY-%05d", i)}, Fn: nothing})
	}
	items = append(items, inbox.BatchItem[*sql.Tx]{Event: inbox.Event{Consumer: "payments", CorrelationID: "evil\tid\n"}, Fn: nothing})
	for len(items) > 0 {
		n := min(len(items), inbox.MaxBatch)
		res, err := ib.ProcessBatch(ctx, items[:n])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Outcome != inbox.Processed {
				t.Fatalf("fixture: %v %v", r.Outcome, r.Err)
			}
		}
		items = items[n:]
	}
	out, err := run(t, "inbox", "ls", "--store", store)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1+1204 {
		t.Fatalf("%d lines, want a header and 1,204 keys", len(lines))
	}
	if !strings.Contains(out, `"evil\tid\n"`) {
		t.Fatal("a hostile id was printed raw")
	}
	out, err = run(t, "inbox", "ls", "--store", store, "--consumer", "refunds", "--json", "--limit", "1000")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "\n"); n != 401 || strings.Contains(out, `"payments"`) {
		t.Fatalf("%d refunds listed (want 401), or other consumers' keys among them", n)
	}
	if out, err = run(t, "inbox", "sweep", "--store", store, "--older-than", "1h"); err != nil || !strings.Contains(out, "swept 0 keys") {
		t.Fatalf("sweep of an hour: %q %v", out, err)
	}
	time.Sleep(20 * time.Millisecond)
	if out, err = run(t, "inbox", "sweep", "--store", store, "--older-than", "10ms", "--batch", "100"); err != nil || !strings.Contains(out, "swept 1204 keys") {
		t.Fatalf("sweep: %q %v", out, err)
	}
	if _, err := run(t, "inbox", "sweep", "--store", store); err == nil {
		t.Fatal("a sweep without --older-than ran")
	}
}
