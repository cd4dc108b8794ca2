package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/as2/as2test"
)

// apiKeyUpstream authenticates by X-Api-Key and counts what it runs.
type apiKeyUpstream struct{ runs atomic.Int32 }

func (u *apiKeyUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Api-Key") == "" {
		http.Error(w, "who are you?", http.StatusUnauthorized)
		return
	}
	n := u.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "order %s for %s (run %d)", body, r.Header.Get("X-Api-Key"), n)
}

func postAs(t *testing.T, addr, method, apiKey, key, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+addr+"/orders", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	if apiKey != "" {
		req.Header.Set("X-Api-Key", apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestGatewayCallersWithoutCredentials: in front of an upstream that
// authenticates with X-Api-Key, the default principal finds none: alice's
// keyed request is forwarded unprotected (not stored), and a caller without
// credentials who sends her key and body gets the upstream's 401, never her
// response, nor a 422 that would tell the key exists; the requests are
// counted. With --principal header:X-Api-Key alice is replayed and the
// caller without credentials still gets 401.
func TestGatewayCallersWithoutCredentials(t *testing.T) {
	up := &apiKeyUpstream{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	g := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+t.TempDir()+"/g.db", "--principal", "default")
	postAs(t, g.addr, "POST", "alice", `"order-1001"`, "10 apples")
	for _, body := range []string{"10 apples", "99 pears"} {
		if status, h, answer := postAs(t, g.addr, "POST", "", `"order-1001"`, body); status != http.StatusUnauthorized || h.Get("Idempotent-Replayed") != "" {
			t.Fatalf("no credentials, %q: %d %q", body, status, answer)
		}
	}
	if !strings.Contains(g.metrics(t), `idem_http_requests_total{outcome="unscoped"} 3`) {
		t.Fatalf("unscoped requests not counted:\n%s", g.metrics(t))
	}
	named := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+t.TempDir()+"/n.db", "--principal", "header:X-Api-Key")
	_, _, first := postAs(t, named.addr, "POST", "alice", `"order-1002"`, "10 apples")
	if _, h, again := postAs(t, named.addr, "POST", "alice", `"order-1002"`, "10 apples"); again != first || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice's retry: %q, first %q", again, first)
	}
	if status, _, answer := postAs(t, named.addr, "POST", "", `"order-1002"`, "10 apples"); status != http.StatusUnauthorized {
		t.Fatalf("no credentials: %d %q", status, answer)
	}
}

// TestGatewayFraming: a keyed lowercase "post" is refused (501), not run
// three times unprotected; a request sent with both Content-Length and
// Transfer-Encoding has its connection closed after its answer, so the
// request pipelined behind it is not read; a Connection header naming
// Authorization or the key is refused.
func TestGatewayFraming(t *testing.T) {
	up := &apiKeyUpstream{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	g := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+t.TempDir()+"/g.db", "--principal", "header:X-Api-Key")
	for range 3 {
		if status, _, answer := postAs(t, g.addr, "post", "alice", `"lower"`, "x"); status != http.StatusNotImplemented {
			t.Fatalf("a keyed lowercase post: %d %q", status, answer)
		}
	}
	if up.runs.Load() != 0 {
		t.Fatalf("the upstream ran %d times", up.runs.Load())
	}

	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /orders HTTP/1.1\r\nHost: x\r\nX-Api-Key: alice\r\nIdempotency-Key: \"te\"\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"+
		"POST /orders HTTP/1.1\r\nHost: x\r\nX-Api-Key: alice\r\nIdempotency-Key: \"smuggled\"\r\nContent-Length: 1\r\n\r\ny")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if second, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("the pipelined request behind Content-Length and Transfer-Encoding was answered: %s", second.Status)
	}

	for _, conn := range []string{"Authorization, Idempotency-Key", "X-Api-Key"} {
		req, _ := http.NewRequest("POST", "http://"+g.addr+"/orders", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", `"conn"`)
		req.Header.Set("X-Api-Key", "alice")
		req.Header.Set("Authorization", "Bearer a")
		req.Header.Set("Connection", conn)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("Connection: %s: %d", conn, resp.StatusCode)
		}
	}
}

// TestAdminListenerRebindingAndTLS: the gateway's loopback admin listener
// answers only to loopback names (a rebound name gets 421 on the console
// and on /metrics alike); served off loopback with TLS, every console page
// needs the admin token, /healthz stays open, and the cookies are Secure.
func TestAdminListenerRebindingAndTLS(t *testing.T) {
	up := httptest.NewServer(&upstream{})
	defer up.Close()
	g := startGateway(t, "--upstream", up.URL, "--store", "sqlite:"+t.TempDir()+"/g.db")
	for _, path := range []string{"/", "/keys", "/metrics"} {
		req, _ := http.NewRequest("GET", "http://"+g.admin+path, nil)
		req.Host = "rebind.attacker.example"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Fatalf("GET %s with a rebound Host: %d", path, resp.StatusCode)
		}
	}

	dir := t.TempDir()
	party := as2test.NewParty(t, dir, "admin", 9)
	admin := "0.0.0.0:" + strings.Split(freeAddr(t), ":")[1]
	cmd := exec.Command(os.Args[0], "serve", "--listen", freeAddr(t), "--upstream", up.URL, "--store", "sqlite:"+dir+"/t.db",
		"--admin", admin, "--admin-token", "s3cret", "--admin-tls-cert", party.CertPath, "--admin-tls-key", party.KeyPath)
	cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base := "https://127.0.0.1:" + strings.Split(admin, ":")[1]
	client := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	waitListening(t, strings.TrimPrefix(base, "https://"))
	resp, err := client.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz over TLS: %d", resp.StatusCode)
	}
	for _, path := range []string{"/", "/keys", "/find?q=x"} {
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
			t.Fatalf("GET %s without the token: %d %s", path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	resp, err = client.Get(base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(resp.Cookies()) == 0 || !resp.Cookies()[0].Secure {
		t.Fatalf("cookies over TLS: %v", resp.Cookies())
	}
}

// TestGatewayRefusesSmuggling: the framings request smuggling relies on
// are refused before the upstream runs (net/http's parser, kept as it is):
// two different Content-Lengths, a Transfer-Encoding other than chunked,
// a space before the colon. (A header folded over two lines is joined with
// a space, as RFC 9112 §5.2 allows.)
func TestGatewayRefusesSmuggling(t *testing.T) {
	up := &apiKeyUpstream{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	g := startGateway(t, "--upstream", srv.URL, "--store", "sqlite:"+t.TempDir()+"/g.db", "--principal", "header:X-Api-Key")
	head := "POST /orders HTTP/1.1\r\nHost: x\r\nX-Api-Key: alice\r\nIdempotency-Key: \"s\"\r\n"
	for name, req := range map[string]string{
		"two Content-Lengths":   head + "Content-Length: 1\r\nContent-Length: 2\r\n\r\nxy",
		"Transfer-Encoding xyz": head + "Transfer-Encoding: xchunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
		"chunked, identity":     head + "Transfer-Encoding: chunked, identity\r\n\r\n1\r\nx\r\n0\r\n\r\n",
		"a space before colon":  head + "Content-Length : 1\r\n\r\nx",
	} {
		c, err := net.Dial("tcp", g.addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, req)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusNotImplemented {
			t.Errorf("%s: %d", name, resp.StatusCode)
		}
	}
	if up.runs.Load() != 0 {
		t.Fatalf("the upstream ran %d times", up.runs.Load())
	}
}

// TestDeliveredFileNamesStayInTheDirectory: keys from the wire (a
// Message-ID, an interchange's ids) with path separators and dot-dot name
// one file inside the directory, never outside it.
func TestDeliveredFileNamesStayInTheDirectory(t *testing.T) {
	dir := t.TempDir()
	inner := dir + "/inner"
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"../../etc/passwd", "BUYER\x00X12|ZZ|../..|ZZ|/tmp/x|1", "..", "a/../../b", `..\..\win`} {
		if err := writeFileOnce(inner, key, ".edi", []byte("x")); err != nil {
			t.Fatalf("%q: %v", key, err)
		}
	}
	files, _ := os.ReadDir(inner)
	if len(files) != 5 {
		t.Fatalf("%d files in the directory, want 5", len(files))
	}
	if outside, _ := os.ReadDir(dir); len(outside) != 1 {
		t.Fatalf("files written outside the directory: %v", outside)
	}
}

// TestUpstreamErrorLogQuotesTheRequest: the log line of a failed upstream
// request quotes the method and path a client sent: a %0A in the path
// forges no line of its own.
func TestUpstreamErrorLogQuotesTheRequest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up, _ := url.Parse("http://" + ln.Addr().String())
	ln.Close() // nothing answers there: the dial fails
	var logged bytes.Buffer
	p := newProxy(up, time.Second, "", false, log.New(&logged, "", 0))
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/orders%0Aforged:%20admin%20logged%20in", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", rec.Code)
	}
	for _, line := range strings.Split(strings.TrimSpace(logged.String()), "\n") {
		if strings.HasPrefix(line, "forged") {
			t.Fatalf("a forged log line: %q", logged.String())
		}
	}
	if !strings.Contains(logged.String(), `"/orders\nforged: admin logged in"`) {
		t.Fatalf("the path is not quoted: %q", logged.String())
	}
}
