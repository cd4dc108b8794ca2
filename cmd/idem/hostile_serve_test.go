package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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
