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
	partner := buyer.Partners["SUPPLIER"]

	// send enqueues key and makes it sent (as a relay would after the
	// partner's 200), and returns the MDN SUPPLIER would build for it.
	send := func(key, payload string, failure *as2.Failure) (http.Header, []byte) {
		id := as2sender.MessageIDFor(buyer, key)
		if err := ob.Enqueue(ctx, outbox.Message{Key: key, Destination: "as2://SUPPLIER", Payload: []byte(x12), ExternalID: id}); err != nil {
			t.Fatal(err)
		}
		r, err := outbox.NewRelay(outbox.RelayConfig{Store: ob.Store, Sender: outbox.SenderFunc(func(context.Context, *outbox.Message) outbox.Result {
			return outbox.Result{Status: outbox.Sent}
		})})
		if err != nil {
			t.Fatal(err)
		}
		r.RunOnce(ctx)
		out, err := buyer.Pack(partner, id, "application/EDI-X12", []byte(payload), "Mon, 30 Nov 2026 08:00:00 GMT")
		if err != nil {
			t.Fatal(err)
		}
		in, err := supplier.Unpack(out.Header, out.Body)
		if err != nil {
			t.Fatal(err)
		}
		h, body, err := supplier.BuildMDN(in, failure, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return h, body
	}
	post := func(h http.Header, body []byte) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
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
		{key: "undecryptable", payload: x12, failure: &as2.Failure{Modifier: as2.DecryptionFailed, Err: fmt.Errorf("x")}, status: 200, row: outbox.Dead, lastError: "decryption-failed"},
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
	h, body := send("stranger", x12, nil)
	h.Set("AS2-From", "STRANGER")
	if got := post(h, body); got != http.StatusForbidden {
		t.Fatalf("a stranger's MDN: %d", got)
	}
}
