package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/internal/testenv"
)

// TestMain lets the tests run this test binary as the idem command in a
// real process (IDEM_TEST_MAIN=1), so the gateway can be killed with SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv("IDEM_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// freeAddr returns a loopback address free now and never returned before
// in this process: the kernel may hand a port just closed out again, and two
// callers of the same test (a gateway's listen and admin addresses, a
// gateway and its upstream) must not share one.
func freeAddr(t *testing.T) string {
	t.Helper()
	handedOutMu.Lock()
	defer handedOutMu.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if !handedOut[addr] {
			handedOut[addr] = true
			return addr
		}
	}
}

var (
	handedOutMu sync.Mutex
	handedOut   = map[string]bool{}
)

// gateway is an idem serve process.
type gateway struct {
	cmd         *exec.Cmd
	addr, admin string
}

func startGateway(t *testing.T, args ...string) *gateway {
	t.Helper()
	g := &gateway{addr: freeAddr(t), admin: freeAddr(t)}
	if !slices.Contains(args, "--principal") {
		// The tests that are not about principals send keys without
		// credentials: one shared scope.
		args = append(args, "--principal", "none")
	}
	g.cmd = exec.Command(os.Args[0], append([]string{"serve", "--listen", g.addr, "--admin", g.admin}, args...)...)
	g.cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	g.cmd.Stderr = os.Stderr
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.cmd.Process.Kill(); _ = g.cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + g.admin + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return g
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not healthy: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (g *gateway) kill9(t *testing.T) {
	t.Helper()
	if err := g.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = g.cmd.Wait()
}

func (g *gateway) post(t *testing.T, key, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+g.addr+"/payments", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func (g *gateway) metrics(t *testing.T) string {
	resp, err := http.Get("http://" + g.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// upstream counts executions and can be made slow.
type upstream struct {
	runs   atomic.Int32
	keys   atomic.Value
	mu     sync.Mutex
	fences []string // each execution's Idempotency-Fence
	delay  time.Duration
	block  chan struct{} // the first execution waits for it
	got    chan struct{}
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.runs.Add(1)
	u.keys.Store(r.Header.Get("Idempotency-Key"))
	u.mu.Lock()
	u.fences = append(u.fences, r.Header.Get(httpidem.FenceHeader))
	u.mu.Unlock()
	if u.got != nil {
		u.got <- struct{}{}
	}
	if u.block != nil && n == 1 {
		<-u.block // only the first execution hangs
	}
	time.Sleep(u.delay)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "payment %d", n)
}

func TestGatewayReplaysAcrossKill9(t *testing.T) {
	up := &upstream{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	store := "sqlite:" + filepath.Join(t.TempDir(), "gw.db")
	g := startGateway(t, "--upstream", srv.URL, "--store", store)
	st, _, body := g.post(t, `"pay-1"`, "amount=10")
	if st != 201 || body != "payment 1" || up.keys.Load() != `"pay-1"` {
		t.Fatalf("first: %d %q, upstream saw key %v", st, body, up.keys.Load())
	}
	g.kill9(t)
	g = startGateway(t, "--upstream", srv.URL, "--store", store)
	st, h, body := g.post(t, `"pay-1"`, "amount=10")
	if st != 201 || body != "payment 1" || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after kill -9: %d %q %v", st, body, h)
	}
	if st, _, _ := g.post(t, `"pay-1"`, "amount=99"); st != 422 {
		t.Fatalf("other payload: %d", st)
	}
	if up.runs.Load() != 1 {
		t.Fatalf("upstream ran %d times", up.runs.Load())
	}
	m := g.metrics(t)
	for _, want := range []string{`idem_http_requests_total{outcome="replayed"} 1`, `idem_http_requests_total{outcome="mismatch"} 1`, `idem_store_operation_seconds_bucket{op="acquire"`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestGatewayKill9MidRequestHoldsLease(t *testing.T) {
	up := &upstream{block: make(chan struct{}), got: make(chan struct{}, 4)}
	srv := httptest.NewServer(up)
	defer srv.Close()
	defer close(up.block)
	store := "sqlite:" + filepath.Join(t.TempDir(), "gw.db")
	g := startGateway(t, "--upstream", srv.URL, "--store", store, "--lease", "4s")
	go func() {
		req, _ := http.NewRequest("POST", "http://"+g.addr+"/payments", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", `"pay-2"`)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-up.got // the upstream is working on it
	g.kill9(t)
	killed := time.Now()
	g = startGateway(t, "--upstream", srv.URL, "--store", store, "--lease", "4s", "--upstream-timeout", "5s")
	if st, _, _ := g.post(t, `"pay-2"`, "x"); st != 409 {
		t.Fatalf("retry while the dead gateway's lease lives: %d, want 409", st)
	}
	time.Sleep(time.Until(killed.Add(4500 * time.Millisecond)))
	done := make(chan int)
	go func() { st, _, _ := g.post(t, `"pay-2"`, "x"); done <- st }()
	<-up.got
	if st := <-done; st != 201 {
		t.Fatalf("retry after the lease expired: %d", st)
	}
	if !strings.Contains(g.metrics(t), "idem_lease_takeovers_total 1") {
		t.Error("the takeover is not counted")
	}
	// Each execution was handed its fence, the takeover's above the dead
	// gateway's: an upstream that conditions its writes on it refuses the
	// first one's late writes.
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.fences) != 2 {
		t.Fatalf("fences %q, want two", up.fences)
	}
	first, err1 := strconv.ParseUint(up.fences[0], 10, 64)
	second, err2 := strconv.ParseUint(up.fences[1], 10, 64)
	if err1 != nil || err2 != nil || first == 0 || second <= first {
		t.Fatalf("fences %q: want two growing numbers", up.fences)
	}
}

// TestGatewayFenceHeaderIsTheGateways: a client cannot choose the fence the
// upstream sees — the gateway replaces an Idempotency-Fence it sends, and
// removes it from requests without a key — and --fence-header names it.
func TestGatewayFenceHeaderIsTheGateways(t *testing.T) {
	up := &upstream{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	store := "sqlite:" + filepath.Join(t.TempDir(), "gw.db")
	g := startGateway(t, "--upstream", srv.URL, "--store", store)
	send := func(key string) {
		req, _ := http.NewRequest("POST", "http://"+g.addr+"/payments", strings.NewReader("x"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		req.Header.Set(httpidem.FenceHeader, "99999999999999999999")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send(`"f-1"`)
	send("")
	up.mu.Lock()
	fences := slices.Clone(up.fences)
	up.mu.Unlock()
	if f, err := strconv.ParseUint(fences[0], 10, 64); err != nil || f == 0 || fences[0] == "99999999999999999999" {
		t.Errorf("with a key the upstream saw fence %q, want the gateway's", fences[0])
	}
	if fences[1] != "" {
		t.Errorf("without a key the upstream saw fence %q, want none", fences[1])
	}
	seen := make(chan string, 1)
	named := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("X-Fencing-Token") + "|" + r.Header.Get(httpidem.FenceHeader)
		w.WriteHeader(http.StatusCreated)
	}))
	defer named.Close()
	g = startGateway(t, "--upstream", named.URL, "--store", store, "--fence-header", "X-Fencing-Token")
	req, _ := http.NewRequest("POST", "http://"+g.addr+"/payments", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", `"f-2"`)
	req.Header.Set("X-Fencing-Token", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := <-seen; got == "1|" || !strings.HasSuffix(got, "|") || got == "|" {
		t.Errorf("with --fence-header X-Fencing-Token the upstream saw %q (X-Fencing-Token|Idempotency-Fence), want the fence in the first only", got)
	}
}

func TestGatewaySIGTERMFinishesInFlight(t *testing.T) {
	up := &upstream{delay: 500 * time.Millisecond, got: make(chan struct{}, 1)}
	srv := httptest.NewServer(up)
	defer srv.Close()
	g := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "gw.db"))
	done := make(chan int)
	go func() { st, _, _ := g.post(t, `"slow"`, ""); done <- st }()
	<-up.got // the request is in the upstream
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if st := <-done; st != 201 {
		t.Fatalf("request in flight at SIGTERM: %d", st)
	}
	if err := g.cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

func TestGatewayUpstreamTimeoutHolds(t *testing.T) {
	up := &upstream{delay: time.Second}
	srv := httptest.NewServer(up)
	defer srv.Close()
	g := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "gw.db"),
		"--upstream-timeout", "200ms", "--lease", "10s")
	if st, _, _ := g.post(t, `"t"`, ""); st != 504 {
		t.Fatalf("timeout: %d, want 504", st)
	}
	if st, _, _ := g.post(t, `"t"`, ""); st != 409 {
		t.Fatalf("retry after an upstream timeout: %d, want 409 (held: the upstream may have done it)", st)
	}
}

// TestGatewayClientGivesUpUpstreamRunsOnce: the client times out after its
// request reached the upstream. The gateway finishes the upstream call
// without it and stores the answer: the retry gets 409 while the upstream
// runs, then the stored answer. The upstream runs once.
func TestGatewayClientGivesUpUpstreamRunsOnce(t *testing.T) {
	up := &upstream{block: make(chan struct{}), got: make(chan struct{}, 10)}
	srv := httptest.NewServer(up)
	var unblock sync.Once
	release := func() { unblock.Do(func() { close(up.block) }) }
	defer srv.Close()
	defer release() // before srv.Close waits for the blocked handler
	g := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "gw.db"), "--lease", "10s")
	impatient := &http.Client{Timeout: 300 * time.Millisecond}
	req, _ := http.NewRequest("POST", "http://"+g.addr+"/payments", strings.NewReader("pay 10"))
	req.Header.Set("Idempotency-Key", `"impatient"`)
	if resp, err := impatient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the client got %d before the upstream answered", resp.StatusCode)
	}
	<-up.got // the request had reached the upstream
	if st, _, body := g.post(t, `"impatient"`, "pay 10"); st != http.StatusConflict {
		t.Fatalf("retry while the upstream still runs: %d %s, want 409", st, body)
	}
	release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, h, body := g.post(t, `"impatient"`, "pay 10")
		if st == http.StatusConflict && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // the gateway is storing the answer
			continue
		}
		if st != http.StatusCreated || body != "payment 1" || h.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry after the upstream answered: %d %q replayed=%q", st, body, h.Get("Idempotent-Replayed"))
		}
		break
	}
	if n := up.runs.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

func TestServeBadFlags(t *testing.T) {
	for _, args := range [][]string{{"serve"}, {"serve", "--upstream", "ftp://x"}, {"serve", "--upstream", "http://x", "--store", "nope"},
		{"serve", "--upstream", "http://x", "--store", "memory:", "--principal", "jwt:sub"}} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("idem %v: no error", args)
		}
	}
}

func TestGatewayKeyFromEDI(t *testing.T) {
	up := &upstream{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	g := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "gw.db"), "--key-from", "edi")
	ic := "UNA:+.? 'UNB+UNOC:3+SENDER:14+US:14+260514:1032+778'UNH+1+ORDERS:D:96A:UN+ORD-1'BGM+220+ORD-1+9'UNT+3+1'UNZ+1+778'"
	post := func(body string) (int, http.Header) {
		resp, err := http.Post("http://"+g.addr+"/as2", "application/EDIFACT", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	if st, _ := post(ic); st != 201 {
		t.Fatalf("first: %d", st)
	}
	if st, h := post(ic); st != 201 || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retransmission: %d %v", st, h)
	}
	changed := strings.Replace(ic, "BGM+220+ORD-1+9", "BGM+220+ORD-2+9", 1)
	if st, _ := post(changed); st != 422 {
		t.Fatalf("same control reference, other content: %d, want 422", st)
	}
	if st, _ := post("not EDI at all"); st != 201 {
		t.Fatalf("a non-EDI body without a key passes through: %d", st)
	}
	if up.runs.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2 (the interchange once, the non-EDI body once)", up.runs.Load())
	}
}

func TestEDIInspectExitCodes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.edi", "UNB+UNOC:3+S+R+260514:1032+R1'UNH+1+ORDERS:D:96A:UN'UNT+2+1'UNZ+1+R1'")
	bad := write("bad.edi", "UNB+UNOC:3+S+R+260514:1032+R1'UNH+1+ORDERS:D:96A:UN'UNT+2+1'UNZ+1+R2'")
	junk := write("junk.txt", "hello")
	out, err := run(t, "edi", "inspect", "--json", good)
	if err != nil || !strings.Contains(out, `"key":"EDIFACT|S||R||R1"`) || !strings.Contains(out, `"valid":true`) || !strings.Contains(out, `"messages":1`) {
		t.Fatalf("good: %v %s", err, out)
	}
	if _, err := run(t, "edi", "inspect", good, bad); err != exitCode(1) {
		t.Fatalf("invalid: %v, want exit 1", err)
	}
	if _, err := run(t, "edi", "inspect", good, bad, junk); err != exitCode(2) {
		t.Fatalf("not EDI: %v, want exit 2", err)
	}
}

// TestGatewayUpstreamDroppedConnectionHolds: the upstream took the request,
// did the work and dropped the connection before it answered (a crash, a
// proxy between them cut). The effect may have happened, as after a
// timeout: the key is held until its lease ends (the retry told 409), not
// released for the retry to run the work a second time at once. An
// upstream that cannot be reached at all (nothing was sent) is 503 and
// released: the retry runs.
func TestGatewayUpstreamDroppedConnectionHolds(t *testing.T) {
	var runs atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1) // the work is done
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close() // and the answer is lost
		}
	}))
	defer srv.Close()
	g := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "gw.db"), "--lease", "10s")
	if st, _, _ := g.post(t, `"dropped"`, "pay 10"); st != 502 {
		t.Fatalf("an upstream that dropped the connection: %d, want 502", st)
	}
	if st, _, _ := g.post(t, `"dropped"`, "pay 10"); st != 409 {
		t.Fatalf("the retry: %d, want 409 (held: the upstream may have done the work)", st)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times", n)
	}

	// The upstream's port is held while the gateway picks its own, so the
	// two cannot be the same (the gateway then proxied to itself: 409),
	// and let go after: nothing listens there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := startGateway(t, "--upstream", "http://"+ln.Addr().String(), "--store", "sqlite:"+filepath.Join(t.TempDir(), "gw2.db"), "--lease", "10s")
	ln.Close()
	for i := range 2 {
		if st, _, _ := down.post(t, `"unreachable"`, "pay 10"); st != 503 {
			t.Fatalf("request %d to an upstream that cannot be reached: %d, want 503 (released, nothing was sent)", i, st)
		}
	}
}

// TestGatewayNeverSendsAKeyedRequestTwice: Go's http.Transport resends a
// request whose connection broke after it was written when it deems the
// request replayable — and a POST with an Idempotency-Key header and no
// body is, to it. Behind the gateway the upstream may have done the work:
// the resend would run it twice under one claim. Here the upstream reads
// the empty POST on a kept-alive connection, then drops the connection
// without answering: the gateway must answer 502 (and hold the key), the
// upstream having seen the request once.
func TestGatewayNeverSendsAKeyedRequestTwice(t *testing.T) {
	var posts atomic.Int32
	var lengths sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return // warms a kept-alive connection up
		}
		posts.Add(1)
		lengths.Store(r.Header.Get("Content-Length")+"/"+strings.Join(r.TransferEncoding, ",")+"/"+r.Header.Get("Idempotency-Key"), true)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	}))
	defer srv.Close()
	g := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "gw.db"))
	resp, err := http.Get("http://" + g.addr + "/warm")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if st, _, _ := g.post(t, `"empty"`, ""); st != http.StatusBadGateway {
		t.Errorf("the upstream dropped the connection: %d, want 502", st)
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("the upstream received the keyed POST %d times, want once", n)
	}
	lengths.Range(func(k, _ any) bool {
		if k != `0//"empty"` {
			t.Errorf("the empty POST went upstream with Content-Length/Transfer-Encoding/Idempotency-Key %q, want 0, none and its key", k)
		}
		return true
	})
}

// TestGatewayExportsTraces: with OTEL_EXPORTER_OTLP_ENDPOINT set, idem serve
// continues the caller's trace in a server span, the guarded run its child
// (acquired, then replayed), and the upstream gets the run's context in
// traceparent.
func TestGatewayExportsTraces(t *testing.T) {
	otlp := newOTLPReceiver(t, "http/protobuf")
	var upParent atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upParent.Store(r.Header.Get("traceparent"))
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	g := startGateway(t, "--upstream", up.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for range 2 {
		req, _ := http.NewRequest("POST", "http://"+g.addr+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", `"PAY-1"`)
		req.Header.Set("traceparent", caller)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("%v %v", resp, err)
		}
		resp.Body.Close()
	}
	var runs []*tracepb.Span
	testenv.Eventually(t, 20*time.Second, "two runs exported", func() error {
		otlp.mu.Lock()
		defer otlp.mu.Unlock()
		runs = runs[:0]
		for _, s := range otlp.spans {
			if s.Name == "idem.run" {
				runs = append(runs, s)
			}
		}
		if len(runs) < 2 {
			return fmt.Errorf("%d runs", len(runs))
		}
		return nil
	})
	server := otlp.span("POST /payments")
	if server == nil || fmt.Sprintf("%x", server.TraceId) != "0af7651916cd43dd8448eb211c80319c" || fmt.Sprintf("%x", server.ParentSpanId) != "b7ad6b7169203331" {
		t.Fatalf("the server span %v does not continue the caller's trace", server)
	}
	outcomes := map[string]bool{}
	for _, r := range runs {
		for _, a := range r.Attributes {
			if a.Key == "idem.outcome" {
				outcomes[a.Value.GetStringValue()] = true
			}
		}
		if fmt.Sprintf("%x", r.TraceId) != "0af7651916cd43dd8448eb211c80319c" {
			t.Errorf("a run in trace %x", r.TraceId)
		}
	}
	if !outcomes["acquired"] || !outcomes["replayed"] {
		t.Fatalf("run outcomes %v, want acquired and replayed", outcomes)
	}
	p, _ := upParent.Load().(string)
	if !strings.HasPrefix(p, "00-0af7651916cd43dd8448eb211c80319c-") || strings.Contains(p, "b7ad6b7169203331") {
		t.Fatalf("the upstream got traceparent %q: not the gateway's span in the caller's trace", p)
	}
}

// TestTransportThroughTheGateway: httpidem.Transport in front of idem
// serve, behind a proxy that cuts the first response after the gateway and
// its upstream answered: the Transport retries with the key it made, the
// upstream runs once — seeing that key — and the caller gets the replay.
func TestTransportThroughTheGateway(t *testing.T) {
	u := &upstream{}
	up := httptest.NewServer(u)
	defer up.Close()
	g := startGateway(t, "--upstream", up.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
	front := testenv.StartCuttingProxy(t, "http://"+g.addr)
	client := &http.Client{Transport: &httpidem.Transport{BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond}}
	resp, err := client.Post(front.URL+"/payments", "application/json", strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	key, _ := u.keys.Load().(string)
	keys := front.Keys()
	if resp.StatusCode != http.StatusCreated || string(body) != "payment 1" || !httpidem.Replayed(resp) || u.runs.Load() != 1 ||
		key == "" || len(keys) != 2 || keys[0] != key || keys[1] != key {
		t.Fatalf("%d %q (replayed %v) after %d runs, the upstream's key %q, the attempts' %q", resp.StatusCode, body, httpidem.Replayed(resp), u.runs.Load(), key, keys)
	}
}

// TestGatewayWaitInFlight: with --wait-in-flight, a duplicate of a request
// in flight waits for the first's response instead of a 409.
func TestGatewayWaitInFlight(t *testing.T) {
	u := &upstream{block: make(chan struct{}), got: make(chan struct{}, 4)}
	up := httptest.NewServer(u)
	defer up.Close()
	g := startGateway(t, "--upstream", up.URL, "--store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "--wait-in-flight", "10s")
	first := make(chan string, 1)
	go func() {
		code, _, body := g.post(t, `"PAY-W"`, `{"amount":1}`)
		first <- fmt.Sprint(code, " ", body)
	}()
	<-u.got
	second := make(chan string, 1)
	go func() {
		code, h, body := g.post(t, `"PAY-W"`, `{"amount":1}`)
		second <- fmt.Sprint(code, " ", body, " replayed=", h.Get("Idempotent-Replayed"))
	}()
	// The duplicate is waiting once it has asked the store again: the
	// first request's acquisition, the duplicate's, and one more.
	testenv.Eventually(t, 10*time.Second, "the duplicate waiting", func() error {
		m := g.metrics(t)
		for _, line := range strings.Split(m, "\n") {
			if v, ok := strings.CutPrefix(line, `idem_store_operation_seconds_count{op="acquire"} `); ok {
				if n, _ := strconv.Atoi(v); n >= 3 {
					return nil
				}
				return fmt.Errorf("%s acquisitions", v)
			}
		}
		return errors.New("no acquisitions yet")
	})
	close(u.block)
	if a, b := <-first, <-second; a != "201 payment 1" || b != "201 payment 1 replayed=true" || u.runs.Load() != 1 {
		t.Fatalf("first %q, duplicate %q, %d runs", a, b, u.runs.Load())
	}
}
