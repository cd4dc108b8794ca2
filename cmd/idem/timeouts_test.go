package main

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// cutOff checks that addr closes a connection whose request body trickles
// in (one byte every 200 ms) and one left idle after a request, each well
// before the test's own bound of 15 s; the listener runs with 1 s timeouts.
func cutOff(t *testing.T, addr, method, path string) {
	t.Helper()
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(15 * time.Second))
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return !os.IsTimeout(err)
			}
		}
	}
	// A body trickled in.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(method + " " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Length: 1000\r\nIdempotency-Key: \"k\"\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	if !closed(c) {
		t.Fatalf("%s: a trickled body kept its connection past 15 s", addr)
	}
	// An idle keep-alive connection.
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := idle.Write([]byte("GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !closed(idle) {
		t.Fatalf("%s: an idle connection stayed open past 15 s", addr)
	}
}

var shortTimeouts = []string{"--read-timeout", "1s", "--idle-timeout", "1s", "--read-header-timeout", "1s"}

// TestListenersTimeOut: idem serve (the gateway and its admin listener),
// idem as2 serve and idem console cut off slow and idle connections.
func TestListenersTimeOut(t *testing.T) {
	t.Run("serve", func(t *testing.T) {
		t.Parallel() // each waits out its own timeouts
		up := httptest.NewServer(&upstream{})
		t.Cleanup(up.Close)
		g := startGateway(t, append([]string{"--upstream", up.URL, "--store", "sqlite:" + t.TempDir() + "/g.db"}, shortTimeouts...)...)
		cutOff(t, g.addr, "POST", "/payments")
		cutOff(t, g.admin, "POST", "/login")
	})
	t.Run("as2 serve", func(t *testing.T) {
		t.Parallel() // each waits out its own timeouts
		w := newAS2World(t)
		serve := startAS2Serve(t, append([]string{"--as2", w.profile("SUPPLIER", "BUYER", "http://127.0.0.1:1/as2", as2SyncAgreement, ""),
			"--store", "sqlite:" + w.path("s.db"), "--dir", w.path("inbox")}, shortTimeouts...)...)
		cutOff(t, strings.TrimPrefix(serve, "http://"), "POST", "/as2")
	})
	t.Run("console", func(t *testing.T) {
		t.Parallel() // each waits out its own timeouts
		addr := freeAddr(t)
		cmd := exec.Command(os.Args[0], append([]string{"console", "--listen", addr, "--store", "memory:"}, shortTimeouts...)...)
		cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		waitListening(t, addr)
		cutOff(t, addr, "POST", "/login")
	})
}

// waitListening waits until addr accepts connections.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listening: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
