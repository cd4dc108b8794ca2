package as2sender_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/as2sender"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
)

// TestAsyncMDNHandler: an asynchronous MDN acks its row only when it
// verifies, names a row sent to its sender, and carries our MIC; a wrong
// MIC sends the row again, a decryption failure kills it, and an MDN that
// does not verify changes nothing.
func TestAsyncMDNHandler(t *testing.T) {
	buyer, supplier := twoProfiles(t, "http://127.0.0.1:1/as2", "    sign: sha256\n    encrypt: aes128-cbc\n    mdn: async\n    mdn_sign: sha256\n")
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "outbox.db")+"?_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	defer db.Close()
	ob, err := outbox.New(databasesql.New(db, sqldriver.SQLite), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(as2sender.AsyncMDNHandler(buyer, ob.Store))
	defer srv.Close()

	// send enqueues key and makes it sent (as a relay would after the
	// partner's 200), and returns the MDN SUPPLIER would build for it.
	send := func(key, payload string, failure *as2.Failure) (http.Header, []byte) {
		return mdnFor(t, ob, buyer, supplier, key, payload, failure, true, true)
	}
	post := func(h http.Header, body []byte) int { return postMDN(t, srv.URL, h, body) }
	for _, c := range []struct {
		key, payload string
		failure      *as2.Failure
		tamper       bool
		status       int
		row          outbox.Status
		lastError    string
	}{
		{key: "ok", payload: x12, status: 200, row: outbox.Acked},
		{key: "other-content", payload: x12 + "X", status: 200, row: outbox.Pending, lastError: "MIC"},
		// An error MDN carries no MIC of our bytes: it never makes the row
		// dead on its own; the row is sent again (the partner deduplicates).
		{key: "undecryptable", payload: x12, failure: &as2.Failure{Modifier: as2.DecryptionFailed, Err: fmt.Errorf("x")}, status: 200, row: outbox.Pending, lastError: "decryption-failed"},
		{key: "tampered", payload: x12, tamper: true, status: 400, row: outbox.Sent},
	} {
		h, body := send(c.key, c.payload, c.failure)
		if c.tamper {
			body = bytes.Replace(body, []byte("processed"), []byte("Processed"), 1)
		}
		if got := post(h, body); got != c.status {
			t.Errorf("%s: status %d, want %d", c.key, got, c.status)
		}
		row, err := ob.Get(ctx, c.key)
		if err != nil || row.Status != c.row || !strings.Contains(row.LastError, c.lastError) {
			t.Errorf("%s: row %s (%q), %v; want %s with %q", c.key, row.Status, row.LastError, err, c.row, c.lastError)
		}
	}
	// An MDN from a stranger is refused before anything is read.
	_ = post
	h, body := send("stranger", x12, nil)
	h.Set("AS2-From", "STRANGER")
	if got := post(h, body); got != http.StatusForbidden {
		t.Fatalf("a stranger's MDN: %d", got)
	}
}

// mdnFor enqueues key for SUPPLIER in ob — sent, as a relay makes it after
// the partner's 200, when sent is true; pending otherwise — and returns the
// MDN SUPPLIER builds for payload under it, signed or not.
func mdnFor(t *testing.T, ob *outbox.Outbox[*sql.Tx], buyer, supplier *as2.Profile, key, payload string, failure *as2.Failure, sent, signed bool) (http.Header, []byte) {
	t.Helper()
	ctx := context.Background()
	id := as2sender.MessageIDFor(buyer, key)
	if err := ob.Enqueue(ctx, outbox.Message{Key: key, Destination: "as2://SUPPLIER", Payload: []byte(x12), ExternalID: id}); err != nil {
		t.Fatal(err)
	}
	if sent {
		r, err := outbox.NewRelay(outbox.RelayConfig{Store: ob.Store, Sender: outbox.SenderFunc(func(_ context.Context, m *outbox.Message) outbox.Result {
			if m.Key != key {
				return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("not now")}
			}
			return outbox.Result{Status: outbox.Sent}
		})})
		if err != nil {
			t.Fatal(err)
		}
		r.RunOnce(ctx)
	}
	out, err := buyer.Pack(buyer.Partners["SUPPLIER"], id, "application/EDI-X12", []byte(payload), "Mon, 30 Nov 2026 08:00:00 GMT")
	if err != nil {
		t.Fatal(err)
	}
	in, err := supplier.Unpack(out.Header, out.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !signed {
		in.MDNSign = 0
	}
	h, body, err := supplier.BuildMDN(in, failure, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return h, body
}

func postMDN(t *testing.T, url string, h http.Header, body []byte) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// openOutbox is a migrated SQLite outbox in a temporary directory.
func openOutbox(t *testing.T) *outbox.Outbox[*sql.Tx] {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "outbox.db")+"?_pragma=busy_timeout(10000)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	ob, err := outbox.New(databasesql.New(db, sqldriver.SQLite), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ob
}

// TestForgedMDNsChangeNothing: SUPPLIER's agreement says its MDNs are
// signed. An unsigned negative MDN for a sent row does not kill it; an
// unsigned processed MDN with the right MIC does not ack a pending row;
// even a genuine signed MDN acks only a sent row, never a pending one that
// was not delivered; and each is answered with a refusal.
func TestForgedMDNsChangeNothing(t *testing.T) {
	buyer, supplier := twoProfiles(t, "http://127.0.0.1:1/as2", "    sign: sha256\n    encrypt: aes128-cbc\n    mdn: async\n    mdn_sign: sha256\n")
	ob := openOutbox(t)
	srv := httptest.NewServer(as2sender.AsyncMDNHandler(buyer, ob.Store))
	defer srv.Close()
	ctx := context.Background()
	negative := &as2.Failure{Modifier: as2.DecryptionFailed, Err: fmt.Errorf("x")}
	for _, c := range []struct {
		key     string
		failure *as2.Failure
		sent    bool
		signed  bool
		row     outbox.Status
		refusal int
	}{
		{"PO-1", negative, true, false, outbox.Sent, http.StatusBadRequest},
		{"PO-2", nil, false, false, outbox.Pending, http.StatusBadRequest},
		{"PO-3", nil, false, true, outbox.Pending, http.StatusConflict},
		{"PO-4", negative, false, true, outbox.Pending, http.StatusConflict},
	} {
		h, body := mdnFor(t, ob, buyer, supplier, c.key, x12, c.failure, c.sent, c.signed)
		if got := postMDN(t, srv.URL, h, body); got != c.refusal {
			t.Errorf("%s: answered %d, want %d", c.key, got, c.refusal)
		}
		if row, err := ob.Get(ctx, c.key); err != nil || row.Status != c.row {
			t.Errorf("%s: row %s (%q), want %s", c.key, row.Status, row.LastError, c.row)
		}
	}
}
