package testenv

import (
	"bufio"
	"io"
	"net"
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
