package testenv

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestProxyDelay: through a proxy with a delay, every exchange with an
// echo server takes at least twice the delay, and a burst of messages
// arrives whole and in order (the chunks do not wait for each other).
func TestProxyDelay(t *testing.T) {
	p := StartProxy(t, serveLoopback(t, func(c net.Conn) { io.Copy(c, c); c.Close() }))
	const delay = 20 * time.Millisecond
	p.SetDelay(delay)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	start := time.Now()
	const burst = 50
	for i := range burst {
		if _, err := c.Write([]byte{byte('a' + i%26), '\n'}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range burst {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line != string([]byte{byte('a' + i%26), '\n'}) {
			t.Fatalf("message %d: %q", i, line)
		}
		if i == 0 {
			if rtt := time.Since(start); rtt < 2*delay {
				t.Fatalf("the first answer came after %v, under twice the delay (%v)", rtt, delay)
			}
		}
	}
}

// TestOutages: a cut refuses connections until it ends, one outage runs at
// a time (Busy), and each is remembered with its kind and span.
func TestOutages(t *testing.T) {
	p := StartProxy(t, serveLoopback(t, func(c net.Conn) { c.Close() }))
	o := NewOutages(p)
	before := time.Now().UnixNano()
	o.Cut(50 * time.Millisecond)
	if !o.Busy() {
		t.Fatal("not busy during a cut")
	}
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		c.Close()
		t.Fatal("the cut proxy accepted a connection")
	}
	o.Wait()
	after := time.Now().UnixNano()
	if o.Busy() {
		t.Fatal("busy after the cut ended")
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("after the cut: %v", err)
	}
	c.Close()
	got := o.During(before, after)
	if len(got) != 1 || got[0].Kind != "cut" || got[0].To-got[0].From < int64(50*time.Millisecond) {
		t.Fatalf("remembered %+v, want one cut of at least 50 ms", got)
	}
	if len(o.During(after+1, after+int64(time.Hour))) != 0 {
		t.Fatal("an outage remembered after it ended")
	}
}

// serveLoopback serves each connection to a loopback listener with handle,
// in a goroutine of its own, until t ends, and returns its address.
func serveLoopback(t *testing.T, handle func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln.Addr().String()
}

// TestCutHoldsTheAddress: while a proxy is cut, no other socket can take
// its address — here a client's connection bound to the proxy's port, as a
// connection given that port as its ephemeral port would be (which made
// Restore fail: "address already in use") — connections to it are refused,
// and Restore then forwards on it again. Cut and Restore twice.
func TestCutHoldsTheAddress(t *testing.T) {
	p := StartProxy(t, serveLoopback(t, func(c net.Conn) { io.Copy(c, c); c.Close() }))
	elsewhere := serveLoopback(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	port := p.Addr()[strings.LastIndexByte(p.Addr(), ':')+1:]
	local, err := net.ResolveTCPAddr("tcp", net.JoinHostPort("127.0.0.1", port))
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		p.Cut()
		if c, err := (&net.Dialer{LocalAddr: local}).Dial("tcp", elsewhere); err == nil {
			defer c.Close()
			t.Fatalf("round %d: a connection took the cut proxy's address %s", round, c.LocalAddr())
		}
		if c, err := net.Dial("tcp", p.Addr()); err == nil {
			c.Close()
			t.Fatalf("round %d: the cut proxy accepted a connection", round)
		}
		p.Restore()
		echo(t, p.Addr())
	}
}

// echo sends a line to the echo server at addr and fails t unless it comes back.
func echo(t *testing.T, addr string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo: %q, %v", line, err)
	}
}
