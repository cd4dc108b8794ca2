package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/idemgo/idem/as2/as2test"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
)

const as2Interchange = "ISA*00*          *00*          *ZZ*BUYER          *ZZ*SUPPLIER       *260514*1032*^*00501*000000905*0*P*:~\n" +
	"GS*PO*BUYER*SUPPLIER*20260514*1032*905*X*005010~\nST*850*0001~\nBEG*00*SA*ORD-1**20260514~\nSE*3*0001~\nGE*1*905~\nIEA*1*000000905~"

// as2World is a directory with BUYER's and SUPPLIER's certificates, where
// the tests write profiles, stores and the interchange to send.
type as2World struct {
	t   *testing.T
	dir string
}

func newAS2World(t *testing.T) *as2World {
	dir := t.TempDir()
	as2test.NewParty(t, dir, "buyer", 1)
	as2test.NewParty(t, dir, "supplier", 2)
	if err := os.WriteFile(filepath.Join(dir, "po.x12"), []byte(as2Interchange), 0o600); err != nil {
		t.Fatal(err)
	}
	return &as2World{t: t, dir: dir}
}

func (w *as2World) path(name string) string { return filepath.Join(w.dir, name) }

// profile writes us's profile with one partner, them, reached at
// themURL under agreement (the partner entry's sign/encrypt/mdn lines), and
// top (extra top-level lines), and returns its path.
func (w *as2World) profile(us, them, themURL, agreement, top string) string {
	path := w.path(strings.ToLower(us) + ".yaml")
	yaml := fmt.Sprintf("as2_id: %s\ncertificate: %s.pem\nprivate_key: %s.key\n%spartners:\n  - as2_id: %s\n    url: %s\n    certificate: %s.pem\n    edi_senders: [%s]\n%s",
		us, strings.ToLower(us), strings.ToLower(us), top, them, themURL, strings.ToLower(them), them, agreement)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return path
}

// enqueue records the interchange for as2://SUPPLIER under key in store.
func (w *as2World) enqueue(store, key string, extra ...string) {
	args := append([]string{"outbox", "enqueue", "--store", store, "--key", key, "--to", "as2://SUPPLIER", "--data-file", w.path("po.x12")}, extra...)
	if _, err := run(w.t, args...); err != nil {
		w.t.Fatal(err)
	}
}

// relay runs `idem relay --as2 profile` on store until the test ends.
func (w *as2World) relay(store, profile string) {
	cmd := exec.Command(os.Args[0], "relay", "--store", store, "--as2", profile, "--backoff-min", "50ms", "--backoff-max", "200ms", "--poll", "100ms")
	cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// settled waits until store's row key is acked or dead, and returns it.
func (w *as2World) settled(store, key string) outbox.Row {
	ctx := context.Background()
	s, closeFn, err := openOutbox(ctx, store)
	if err != nil {
		w.t.Fatal(err)
	}
	defer closeFn()
	deadline := time.Now().Add(30 * time.Second)
	for {
		row, err := s.Get(ctx, key)
		if err == nil && (row.Status == outbox.Acked || row.Status == outbox.Dead) {
			return row
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s not settled in 30s: %+v %v", key, row, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

const as2SyncAgreement = "    sign: sha256\n    encrypt: aes256-cbc\n    mdn: sync\n    mdn_sign: sha256\n"

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
	w := newAS2World(t)
	inbox := w.path("inbox")
	serve := startAS2Serve(t, "--as2", w.profile("SUPPLIER", "BUYER", "http://127.0.0.1:1/as2", as2SyncAgreement, ""),
		"--store", "sqlite:"+w.path("supplier.db"), "--dir", inbox)

	// The proxy in front of the receiver: the first message is handled,
	// but its answer is lost.
	var posts atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequest(http.MethodPost, serve+"/as2", bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadGateway)
			return
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if posts.Add(1) == 1 {
			c, _, _ := rw.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		for k, v := range resp.Header {
			rw.Header()[k] = v
		}
		rw.WriteHeader(resp.StatusCode)
		rw.Write(answer)
	}))
	defer proxy.Close()

	store := "sqlite:" + w.path("outbox.db")
	w.enqueue(store, "PO-1")
	w.relay(store, w.profile("BUYER", "SUPPLIER", proxy.URL+"/as2", as2SyncAgreement, ""))
	if row := w.settled(store, "PO-1"); row.Status != outbox.Acked || row.Tries != 2 {
		t.Fatalf("row %s after %d tries (%s); want acked after 2", row.Status, row.Tries, row.LastError)
	}
	files, _ := filepath.Glob(filepath.Join(inbox, "*.edi"))
	if len(files) != 1 {
		t.Fatalf("%d interchange files, want 1: %v", len(files), files)
	}
	if got, _ := os.ReadFile(files[0]); string(got) != as2Interchange {
		t.Fatalf("delivered %q", got)
	}
	if rejected, _ := filepath.Glob(filepath.Join(inbox+".rejected", "*")); len(rejected) != 0 {
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
	w := newAS2World(t)
	buyerAddr, supplierAddr := freeAddr(t), freeAddr(t)
	async := "    sign: sha256\n    encrypt: aes128-cbc\n    mdn: async\n    mdn_sign: sha256\n    async_mdn_urls: [http://" + buyerAddr + "/as2/mdn]\n"
	mdnURL := "mdn_url: http://" + buyerAddr + "/as2/mdn\n"
	buyer := w.profile("BUYER", "SUPPLIER", "http://"+supplierAddr+"/as2", async, mdnURL)
	supplier := w.profile("SUPPLIER", "BUYER", "http://"+buyerAddr+"/as2", async, mdnURL)
	outboxStore := "sqlite:" + w.path("buyer-outbox.db")
	startAS2Serve(t, "--listen", supplierAddr, "--as2", supplier, "--store", "sqlite:"+w.path("supplier.db"),
		"--dir", w.path("supplier-inbox"), "--outbox", "sqlite:"+w.path("supplier-outbox.db"))
	startAS2Serve(t, "--listen", buyerAddr, "--as2", buyer, "--store", "sqlite:"+w.path("buyer.db"),
		"--dir", w.path("buyer-inbox"), "--outbox", outboxStore)

	w.enqueue(outboxStore, "PO-9", "--as2", buyer)
	w.relay(outboxStore, buyer)
	row := w.settled(outboxStore, "PO-9")
	if row.Status != outbox.Acked || row.Tries != 1 || row.ExternalID == "" {
		t.Fatalf("row %s after %d tries (%s), external id %q; want acked after 1", row.Status, row.Tries, row.LastError, row.ExternalID)
	}
	if files, _ := filepath.Glob(filepath.Join(w.path("supplier-inbox"), "*.edi")); len(files) != 1 {
		t.Fatalf("%d interchange files at the supplier", len(files))
	}
}

// TestAS2Forward: `idem as2 serve --forward` posts each interchange upstream
// with Idempotency-Key set to its interchange key and the AS2 headers; an
// upstream 503 is answered 503 (nothing stored), so the relay's retry
// delivers it; a message from a stranger is answered 403 and not kept.
func TestAS2Forward(t *testing.T) {
	w := newAS2World(t)
	var calls atomic.Int64
	keys := make(chan string, 10)
	upstream := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if string(body) != as2Interchange || r.Header.Get("AS2-From") != "BUYER" || r.Header.Get("Message-ID") == "" {
			http.Error(rw, "unexpected", http.StatusBadRequest)
			return
		}
		keys <- r.Header.Get("Idempotency-Key")
		if calls.Add(1) == 1 {
			http.Error(rw, "busy", http.StatusServiceUnavailable)
			return
		}
		rw.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	gcm := "    sign: sha256\n    encrypt: aes256-gcm\n    mdn: sync\n    mdn_sign: sha256\n"
	supplierStore := "sqlite:" + w.path("supplier.db")
	rejectedDir := w.path("rejected")
	serve := startAS2Serve(t, "--as2", w.profile("SUPPLIER", "BUYER", "http://127.0.0.1:1/as2", gcm, ""), "--store", supplierStore,
		"--forward", upstream.URL, "--rejected-dir", rejectedDir)

	store := "sqlite:" + w.path("outbox.db")
	w.enqueue(store, "PO-7")
	w.relay(store, w.profile("BUYER", "SUPPLIER", serve+"/as2", gcm, ""))
	if row := w.settled(store, "PO-7"); row.Status != outbox.Acked {
		t.Fatalf("row %s (%s)", row.Status, row.LastError)
	}
	first, second := <-keys, <-keys
	if first != second || !strings.Contains(first, "X12|ZZ|BUYER|ZZ|SUPPLIER|000000905") || calls.Load() != 2 {
		t.Fatalf("upstream saw keys %q and %q in %d calls", first, second, calls.Load())
	}
	// A stranger's message: refused, nothing kept.
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
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || bytes.Contains(answer, []byte("processed")) {
		t.Fatalf("a stranger got %d %s", resp.StatusCode, answer)
	}
	if kept, _ := os.ReadDir(rejectedDir); len(kept) != 0 {
		t.Fatalf("kept %d files of a stranger's", len(kept))
	}
}

// TestAS2Traces: with OTEL_EXPORTER_OTLP_ENDPOINT set for both, the relay's
// AS2 send and idem as2 serve's handling are one trace: the send span
// (client kind) carries its context in traceparent, the receiver's server
// span is its child and the guarded delivery the server span's, and the
// forwarded interchange carries the delivery's context upstream.
func TestAS2Traces(t *testing.T) {
	w := newAS2World(t)
	otlp := newOTLPReceiver(t, "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	upParent := make(chan string, 4)
	upstream := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		upParent <- r.Header.Get("traceparent")
		rw.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	gcm := "    sign: sha256\n    encrypt: aes256-gcm\n    mdn: sync\n    mdn_sign: sha256\n"
	serve := startAS2Serve(t, "--as2", w.profile("SUPPLIER", "BUYER", "http://127.0.0.1:1/as2", gcm, ""), "--store", "sqlite:"+w.path("supplier.db"),
		"--forward", upstream.URL, "--rejected-dir", w.path("rejected"))
	store := "sqlite:" + w.path("outbox.db")
	w.enqueue(store, "PO-9")
	w.relay(store, w.profile("BUYER", "SUPPLIER", serve+"/as2", gcm, ""))
	if row := w.settled(store, "PO-9"); row.Status != outbox.Acked {
		t.Fatalf("row %s (%s)", row.Status, row.LastError)
	}
	forwarded := <-upParent
	// The receiver runs a message under its Message-ID, and each
	// interchange in it under the interchange's key: two runs, nested.
	var send, server, message, interchange *tracepb.Span
	testenv.Eventually(t, 20*time.Second, "the spans of both processes exported", func() error {
		send, server = otlp.span("send SUPPLIER"), otlp.span("POST /as2")
		if send == nil || server == nil {
			return errors.New("not yet")
		}
		message, interchange = otlp.child(server, "idem.run"), nil
		if message != nil {
			interchange = otlp.child(message, "idem.run")
		}
		if interchange == nil {
			return errors.New("not yet")
		}
		return nil
	})
	if send.Kind != tracepb.Span_SPAN_KIND_CLIENT || !bytes.Equal(server.TraceId, send.TraceId) || !bytes.Equal(server.ParentSpanId, send.SpanId) ||
		!bytes.Equal(interchange.TraceId, send.TraceId) {
		t.Fatalf("send %x/%x (%v), server %x parent %x, the interchange's run %x", send.TraceId, send.SpanId, send.Kind, server.TraceId, server.ParentSpanId, interchange.TraceId)
	}
	if want := fmt.Sprintf("00-%x-%x-01", send.TraceId, interchange.SpanId); forwarded != want {
		t.Fatalf("the upstream got traceparent %q, want the interchange run's %q", forwarded, want)
	}
}
