package testenv

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy in front of a real server, so a test can take the
// server away from a client (Cut: every connection closed, new ones refused)
// and give it back (Restore) without stopping the server other tests share.
type Proxy struct {
	t      testing.TB
	target string
	addr   string

	mu      sync.Mutex
	ln      net.Listener
	hold    *portHold // while cut: the address, kept for Restore
	conns   map[net.Conn]struct{}
	stalled chan struct{} // non-nil while stalled: closed by Unstall
	delay   time.Duration // each direction, for connections opened after SetDelay
}

// StartProxy listens on a free loopback port and forwards to target.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p := &Proxy{t: t, target: target, conns: map[net.Conn]struct{}{}}
	ln, err := listenHoldable("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr }

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) pipe(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c) || !p.track(s) {
		c.Close()
		s.Close()
		return
	}
	p.mu.Lock()
	delay := p.delay
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.copy(s, c, delay); done <- struct{}{} }()
	go func() { p.copy(c, s, delay); done <- struct{}{} }()
	<-done
	c.Close()
	s.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, s)
	p.mu.Unlock()
}

// copy forwards src to dst, holding what it read while the proxy is
// stalled, and each chunk for delay after it was read.
func (p *Proxy) copy(dst io.Writer, src io.Reader, delay time.Duration) {
	if delay > 0 {
		dst = newDelayedWriter(dst, delay)
		defer dst.(*delayedWriter).close()
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.stalled
			p.mu.Unlock()
			if gate != nil {
				<-gate
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// SetDelay makes the connections opened from now on deliver every chunk d
// after the proxy read it, in each direction — a distant server, for
// measuring what latency does to a client (a round trip then takes at least
// 2d). Chunks keep their order and do not wait for each other: a delay, not
// a bandwidth limit.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// delayedWriter writes each chunk to w delay after Write was given it.
type delayedWriter struct {
	w      io.Writer
	delay  time.Duration
	chunks chan delayedChunk
	failed chan struct{} // closed when a write to w failed
	done   chan struct{}
}

type delayedChunk struct {
	at   time.Time
	data []byte
}

func newDelayedWriter(w io.Writer, delay time.Duration) *delayedWriter {
	d := &delayedWriter{w: w, delay: delay, chunks: make(chan delayedChunk, 4096), failed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		for c := range d.chunks {
			time.Sleep(time.Until(c.at))
			if _, err := d.w.Write(c.data); err != nil {
				close(d.failed)
				for range d.chunks { // drain, so Write never blocks
				}
				return
			}
		}
	}()
	return d
}

func (d *delayedWriter) Write(b []byte) (int, error) {
	select {
	case <-d.failed:
		return 0, io.ErrClosedPipe
	case d.chunks <- delayedChunk{at: time.Now().Add(d.delay), data: append([]byte(nil), b...)}:
		return len(b), nil
	}
}

// close delivers what is pending, then returns.
func (d *delayedWriter) close() {
	close(d.chunks)
	<-d.done
}

// Stall holds every byte in either direction, on open connections and new
// ones, until Unstall: a server or network that stops answering without
// closing anything — calls hang instead of failing.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Unstall lets the held bytes through and forwards again.
func (p *Proxy) Unstall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// Cut closes every proxied connection and refuses new ones until Restore.
// The address stays the proxy's meanwhile (on Linux): no other socket — a
// connection given the port as its ephemeral port, another server — can
// take it and make Restore fail.
func (p *Proxy) Cut() { p.cut(true) }

// close cuts the proxy for good when its test ends.
func (p *Proxy) close() { p.cut(false) }

func (p *Proxy) cut(keepAddr bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		if keepAddr {
			hold, err := holdPort(p.addr)
			if err != nil && !errors.Is(err, errors.ErrUnsupported) {
				p.t.Errorf("proxy: %v", err)
			}
			p.hold = hold // bound before the listener goes: never free
		}
		p.ln.Close()
		p.ln = nil
	}
	if !keepAddr && p.hold != nil {
		p.hold.release()
		p.hold = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
	if p.stalled != nil { // the held copies end on the closed connections
		close(p.stalled)
		p.stalled = nil
	}
}

// Restore accepts connections again on the same address. It may be called
// from any goroutine; a failure fails the test.
func (p *Proxy) Restore() {
	p.mu.Lock()
	hold := p.hold
	p.hold = nil
	p.mu.Unlock()
	var ln net.Listener
	var err error
	if hold != nil {
		ln, err = hold.listen()
	} else {
		ln, err = listenHoldable(p.addr)
	}
	if err != nil {
		p.t.Errorf("proxy: listen again on %s: %v", p.addr, err)
		return
	}
	p.serve(ln)
}

// Outages cuts and stalls a Proxy in the background, one outage at a time,
// for a fault campaign, and remembers them for its checks.
type Outages struct {
	p    *Proxy
	on   atomic.Bool
	wg   sync.WaitGroup
	mu   sync.Mutex
	past []Outage
}

// Outage is one cut or stall, unix ns.
type Outage struct {
	From, To int64
	Kind     string // "cut" or "stall"
}

// NewOutages returns p's outages (none yet).
func NewOutages(p *Proxy) *Outages { return &Outages{p: p} }

// Busy reports whether an outage is under way.
func (o *Outages) Busy() bool { return o.on.Load() }

// Cut cuts the proxy and restores it after d, in the background.
func (o *Outages) Cut(d time.Duration) { o.start("cut", o.p.Cut, o.p.Restore, d) }

// Stall stalls the proxy and lets it go on after d, in the background.
func (o *Outages) Stall(d time.Duration) { o.start("stall", o.p.Stall, o.p.Unstall, d) }

func (o *Outages) start(kind string, begin, end func(), d time.Duration) {
	o.on.Store(true)
	o.wg.Add(1)
	from := time.Now().UnixNano()
	begin()
	time.AfterFunc(d, func() {
		defer o.wg.Done()
		end()
		o.mu.Lock()
		o.past = append(o.past, Outage{from, time.Now().UnixNano(), kind})
		o.mu.Unlock()
		o.on.Store(false)
	})
}

// Wait waits for the outage under way to end.
func (o *Outages) Wait() { o.wg.Wait() }

// During returns the outages that overlapped [from, to] (unix ns).
func (o *Outages) During(from, to int64) []Outage {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []Outage
	for _, x := range o.past {
		if x.From <= to && x.To >= from {
			out = append(out, x)
		}
	}
	return out
}
