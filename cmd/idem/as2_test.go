package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/as2/as2test"
	"github.com/idemgo/idem/outbox"
)

const as2Interchange = "ISA*00*          *00*          *ZZ*BUYER          *ZZ*SUPPLIER       *260514*1032*^*00501*000000905*0*P*:~\n" +
	"GS*PO*BUYER*SUPPLIER*20260514*1032*905*X*005010~\nST*850*0001~\nBEG*00*SA*ORD-1**20260514~\nSE*3*0001~\nGE*1*905~\nIEA*1*000000905~"

// startAS2Serve runs `idem as2 serve` as a child process and returns its
// base URL once it listens.
func startAS2Serve(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"as2", "serve", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		if _, addr, ok := strings.Cut(line, " on http://"); ok {
			go io.Copy(io.Discard, stderr)
			return "http://" + strings.TrimSuffix(addr, "/as2")
		}
		t.Log(line)
	}
	t.Fatal("idem as2 serve ended before it listened")
	return ""
}

// TestAS2EndToEnd: an interchange enqueued for as2://SUPPLIER goes through
// `idem relay --as2` (signed, encrypted, a signed MDN asked for) to `idem
// as2 serve --dir` behind a proxy that loses the first answer: the relay
// retries, the receiver replays the same MDN, the row is acked after two
// tries, and the interchange is written once.
func TestAS2EndToEnd(t *testing.T) {
	dir := t.TempDir()
	as2test.NewParty(t, dir, "buyer", 1)
	as2test.NewParty(t, dir, "supplier", 2)
	inbox := filepath.Join(dir, "inbox")

	profile := func(name, us, them, themURL string) string {
		path := filepath.Join(dir, name)
		yaml := fmt.Sprintf("as2_id: %s\ncertificate: %s.pem\nprivate_key: %s.key\npartners:\n  - as2_id: %s\n    url: %s\n    certificate: %s.pem\n    sign: sha256\n    encrypt: aes256-cbc\n    mdn: sync\n    mdn_sign: sha256\n",
			us, strings.ToLower(us), strings.ToLower(us), them, themURL, strings.ToLower(them))
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	serve := startAS2Serve(t, "--as2", profile("supplier.yaml", "SUPPLIER", "BUYER", "http://127.0.0.1:1/as2"),
		"--store", "sqlite:"+filepath.Join(dir, "supplier.db"), "--dir", inbox)

	// The proxy in front of the receiver: the first message is handled,
	// but its answer is lost.
	upstream, _ := url.Parse(serve)
	var posts atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequest(http.MethodPost, upstream.String()+"/as2", bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if posts.Add(1) == 1 {
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(answer)
	}))
	defer proxy.Close()

	store := "sqlite:" + filepath.Join(dir, "outbox.db")
	data := filepath.Join(dir, "po.x12")
	if err := os.WriteFile(data, []byte(as2Interchange), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "outbox", "enqueue", "--store", store, "--key", "PO-1", "--to", "as2://SUPPLIER", "--data-file", data); err != nil {
		t.Fatal(err)
	}
	relay := exec.Command(os.Args[0], "relay", "--store", store, "--as2", profile("buyer.yaml", "BUYER", "SUPPLIER", proxy.URL+"/as2"),
		"--http-timeout", "5s", "--backoff-min", "50ms", "--backoff-max", "200ms", "--poll", "100ms")
	relay.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = relay.Process.Kill(); _ = relay.Wait() }()

	ctx := context.Background()
	s, closeFn, err := openOutbox(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	var row outbox.Row
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err := s.List(ctx, "", 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 1 && rows[0].Status != outbox.Pending {
			row = rows[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered in 30s: %+v", rows)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if row.Status != outbox.Acked || row.Tries != 2 {
		t.Fatalf("row %s after %d tries (%s); want acked after 2", row.Status, row.Tries, row.LastError)
	}
	files, _ := filepath.Glob(filepath.Join(inbox, "*.edi"))
	if len(files) != 1 {
		t.Fatalf("%d interchange files, want 1: %v", len(files), files)
	}
	got, _ := os.ReadFile(files[0])
	if string(got) != as2Interchange {
		t.Fatalf("delivered %q", got)
	}
	if rejected, _ := filepath.Glob(filepath.Join(inbox, "rejected", "*")); len(rejected) != 0 {
		t.Fatalf("rejected %v", rejected)
	}
	if posts.Load() != 2 {
		t.Fatalf("%d posts, want 2", posts.Load())
	}
}

// TestAS2AsynchronousMDN: BUYER asks SUPPLIER for a signed asynchronous
// MDN. SUPPLIER's `idem as2 serve --outbox` answers the POST with a bare 200
// and sends the MDN through its outbox to BUYER's mdn_url, where BUYER's
// `idem as2 serve --outbox` (on the relay's outbox) verifies it, finds the
// row by its stored Message-ID, checks the MIC, and acks it.
func TestAS2AsynchronousMDN(t *testing.T) {
	dir := t.TempDir()
	as2test.NewParty(t, dir, "buyer", 1)
	as2test.NewParty(t, dir, "supplier", 2)
	buyerAddr, supplierAddr := freeAddr(t), freeAddr(t)
	profile := func(name, us, them, themURL string) string {
		path := filepath.Join(dir, name)
		yaml := fmt.Sprintf("as2_id: %s\ncertificate: %s.pem\nprivate_key: %s.key\nmdn_url: http://%s/as2/mdn\npartners:\n  - as2_id: %s\n    url: %s\n    certificate: %s.pem\n    sign: sha256\n    encrypt: aes128-cbc\n    mdn: async\n    mdn_sign: sha256\n",
			us, strings.ToLower(us), strings.ToLower(us), buyerAddr, them, themURL, strings.ToLower(them))
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	buyerProfile := profile("buyer.yaml", "BUYER", "SUPPLIER", "http://"+supplierAddr+"/as2")
	supplierProfile := profile("supplier.yaml", "SUPPLIER", "BUYER", "http://"+buyerAddr+"/as2")
	outboxStore := "sqlite:" + filepath.Join(dir, "buyer-outbox.db")
	startAS2Serve(t, "--listen", supplierAddr, "--as2", supplierProfile, "--store", "sqlite:"+filepath.Join(dir, "supplier.db"),
		"--dir", filepath.Join(dir, "supplier-inbox"), "--outbox", "sqlite:"+filepath.Join(dir, "supplier-outbox.db"))
	startAS2Serve(t, "--listen", buyerAddr, "--as2", buyerProfile, "--store", "sqlite:"+filepath.Join(dir, "buyer.db"),
		"--dir", filepath.Join(dir, "buyer-inbox"), "--outbox", outboxStore)

	data := filepath.Join(dir, "po.x12")
	if err := os.WriteFile(data, []byte(as2Interchange), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "outbox", "enqueue", "--store", outboxStore, "--key", "PO-9", "--to", "as2://SUPPLIER", "--data-file", data, "--as2", buyerProfile); err != nil {
		t.Fatal(err)
	}
	relay := exec.Command(os.Args[0], "relay", "--store", outboxStore, "--as2", buyerProfile, "--backoff-min", "50ms", "--backoff-max", "200ms", "--poll", "100ms")
	relay.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = relay.Process.Kill(); _ = relay.Wait() }()

	ctx := context.Background()
	s, closeFn, err := openOutbox(ctx, outboxStore)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	deadline := time.Now().Add(30 * time.Second)
	for {
		row, err := s.Get(ctx, "PO-9")
		if err == nil && row.Status == outbox.Acked {
			if row.Tries != 1 || row.ExternalID == "" {
				t.Fatalf("acked after %d tries, external id %q", row.Tries, row.ExternalID)
			}
			break
		}
		if err == nil && row.Status == outbox.Dead {
			t.Fatalf("dead: %s", row.LastError)
		}
		if time.Now().After(deadline) {
			t.Fatalf("not acked in 30s: %+v %v", row, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "supplier-inbox", "*.edi")); len(files) != 1 {
		t.Fatalf("%d interchange files at the supplier", len(files))
	}
}

// TestAS2Forward: `idem as2 serve --forward` posts each interchange upstream
// with Idempotency-Key set to its interchange key and the AS2 headers; an
// upstream 503 is answered 503 (nothing stored), so the relay's retry
// delivers it; a message from a stranger is kept in the store (scope
// as2-rejected) and answered with an error MDN.
func TestAS2Forward(t *testing.T) {
	dir := t.TempDir()
	as2test.NewParty(t, dir, "buyer", 1)
	as2test.NewParty(t, dir, "supplier", 2)
	var calls atomic.Int64
	keys := make(chan string, 10)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if string(body) != as2Interchange || r.Header.Get("AS2-From") != "BUYER" || r.Header.Get("Message-ID") == "" {
			http.Error(w, "unexpected", http.StatusBadRequest)
			return
		}
		keys <- r.Header.Get("Idempotency-Key")
		if calls.Add(1) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	profile := func(name, us, them, themURL string) string {
		path := filepath.Join(dir, name)
		yaml := fmt.Sprintf("as2_id: %s\ncertificate: %s.pem\nprivate_key: %s.key\npartners:\n  - as2_id: %s\n    url: %s\n    certificate: %s.pem\n    sign: sha256\n    encrypt: aes256-gcm\n    mdn: sync\n    mdn_sign: sha256\n",
			us, strings.ToLower(us), strings.ToLower(us), them, themURL, strings.ToLower(them))
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	supplierStore := "sqlite:" + filepath.Join(dir, "supplier.db")
	serve := startAS2Serve(t, "--as2", profile("supplier.yaml", "SUPPLIER", "BUYER", "http://127.0.0.1:1/as2"), "--store", supplierStore, "--forward", upstream.URL)

	store := "sqlite:" + filepath.Join(dir, "outbox.db")
	data := filepath.Join(dir, "po.x12")
	if err := os.WriteFile(data, []byte(as2Interchange), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "outbox", "enqueue", "--store", store, "--key", "PO-7", "--to", "as2://SUPPLIER", "--data-file", data); err != nil {
		t.Fatal(err)
	}
	relay := exec.Command(os.Args[0], "relay", "--store", store, "--as2", profile("buyer.yaml", "BUYER", "SUPPLIER", serve+"/as2"),
		"--backoff-min", "50ms", "--backoff-max", "200ms", "--poll", "100ms")
	relay.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = relay.Process.Kill(); _ = relay.Wait() }()
	ctx := context.Background()
	s, closeFn, err := openOutbox(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	deadline := time.Now().Add(30 * time.Second)
	for {
		row, err := s.Get(ctx, "PO-7")
		if err == nil && row.Status == outbox.Acked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not acked: %+v %v", row, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	first, second := <-keys, <-keys
	if first != second || !strings.Contains(first, "X12|ZZ|BUYER|ZZ|SUPPLIER|000000905") || calls.Load() != 2 {
		t.Fatalf("upstream saw keys %q and %q in %d calls", first, second, calls.Load())
	}
	// A stranger's message: an error MDN, and the raw message kept.
	req, _ := http.NewRequest(http.MethodPost, serve+"/as2", strings.NewReader("not a message"))
	req.Header.Set("Content-Type", "application/edi-x12")
	req.Header.Set("Message-ID", "<stranger-1@nowhere>")
	req.Header.Set("AS2-From", "STRANGER")
	req.Header.Set("AS2-To", "SUPPLIER")
	req.Header.Set("Disposition-Notification-To", "ops@nowhere")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mdn, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(mdn, []byte("processed/error: authentication-failed")) {
		t.Fatalf("a stranger got %d %s", resp.StatusCode, mdn)
	}
	out, err := run(t, "keys", "ls", "--store", supplierStore)
	if err != nil || !strings.Contains(out, "as2-rejected/stranger-1@nowhere") {
		t.Fatalf("the refused message is not in the store: %v\n%s", err, out)
	}
}
