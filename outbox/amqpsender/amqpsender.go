// Package amqpsender delivers outbox messages to an AMQP 0-9-1 broker
// (RabbitMQ): a persistent publish with publisher confirms to
// amqp://…?exchange=E&routing_key=R, with the key as the message-id.
package amqpsender

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/outbox"
)

// Sender publishes with publisher confirms: destination
// amqp://USER:PASS@HOST:PORT/VHOST?exchange=E&routing_key=R (exchange ""
// is the default exchange, routing to the queue named R; amqps:// with
// TLS, the files of a private CA or a client certificate given as
// &cacertfile=…&certfile=…&keyfile=…; &routing_key_from=ordering_key routes
// a message by its ordering key; the user and password better given to
// New than written in every row), the key in the
// message-id property, persistent delivery, mandatory. A confirmed publish
// is sent; a nack or a lost connection is retried, and so is a publish no
// queue takes (no queue of that name, no binding): RabbitMQ confirms those
// too, and drops them — published mandatory, it returns them first, and the
// message stays pending with the reason until a queue takes it. One
// connection per server, one confirm channel per send at a time. A send
// waits no longer than its context (the relay's SendTimeout), whatever the
// broker does; while the broker blocks publishing (a resource alarm: low on
// disk or memory) a send stays pending at once with the broker's reason; a connection whose broker did not confirm in time is dropped
// and dialed again by the next send.
type Sender struct {
	cfg     amqp.Config
	mu      sync.Mutex
	conns   map[string]*amqpConn
	dialErr map[string]error // why the last dial to a server failed after its send gave up
}

type amqpConn struct {
	conn    *amqp.Connection
	pool    chan *confirmChannel
	blocked atomic.Pointer[string] // why the broker blocks the connection's publishes; nil while it does not
}

// watchBlocked keeps c.blocked up to date with the broker's
// connection.blocked and connection.unblocked until the connection ends.
func (c *amqpConn) watchBlocked(notes chan amqp.Blocking) {
	for b := range notes {
		if b.Active {
			reason := b.Reason
			c.blocked.Store(&reason)
		} else {
			c.blocked.Store(nil)
		}
	}
}

// blockedErr is the broker's block of c's publishes, or nil.
func (c *amqpConn) blockedErr() error {
	if reason := c.blocked.Load(); reason != nil {
		return fmt.Errorf("the broker blocks publishing on this connection (%s): a resource alarm of the node; sent again once it clears", *reason)
	}
	return nil
}

// confirmChannel is a channel in confirm mode, with the returns of its
// mandatory publishes: a publish no queue takes is returned (basic.return)
// before the broker confirms it, so its return is here by the time its
// confirmation is.
type confirmChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error // why the broker closed the channel (a publish to an exchange that does not exist)
}

// New returns the AMQP sender. Every connection it opens is opened with cfg
// (amqp.DialConfig): its SASL credentials are the ones the sender logs in
// with on every server, taking precedence over a user and password in a
// destination's URL, so outbox rows need carry no secret; likewise its TLS
// settings and heartbeat. The zero Config dials as amqp.Dial does: with the
// URL's user and password, or guest/guest.
//
// Every write to a broker's socket must make progress within
// WriteStall: a broker that stops reading (stalled, or blocking its
// publishers) fails the connection then, rather than holding it — and every
// send and Close waiting behind its write — for ever.
func New(cfg amqp.Config) *Sender {
	dial := cfg.Dial
	if dial == nil {
		dial = amqp.DefaultDial(30 * time.Second)
	}
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		c, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		return writeDeadlineConn{c}, nil
	}
	return &Sender{cfg: cfg, conns: map[string]*amqpConn{}, dialErr: map[string]error{}}
}

// WriteStall bounds how long one write to a broker's socket may wait.
const WriteStall = 15 * time.Second

// writeDeadlineConn gives every write WriteStall to complete.
type writeDeadlineConn struct{ net.Conn }

func (c writeDeadlineConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(WriteStall)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// ParseDestination splits a destination into the server URL, exchange and
// routing key. The query's other parameters are amqp091-go's connection
// parameters (cacertfile, certfile, keyfile, server_name_indication,
// heartbeat, connection_timeout, channel_max, auth_mechanism) and stay in
// the server URL.
func ParseDestination(dest string) (server, exchange, key string, err error) {
	server, exchange, key, _, err = parseDestination(dest)
	return server, exchange, key, err
}

// parseDestination is ParseDestination, and whether the destination asks
// for the message's ordering key as its routing key
// (routing_key_from=ordering_key: a consistent-hash exchange then keeps
// each key on one queue).
func parseDestination(dest string) (server, exchange, key string, fromOrderingKey bool, err error) {
	u, err := url.Parse(dest)
	if err != nil || u.Host == "" {
		return "", "", "", false, fmt.Errorf("want amqp://…/VHOST?exchange=E&routing_key=R, got %q", dest)
	}
	q := u.Query()
	exchange, key = q.Get("exchange"), q.Get("routing_key")
	switch from := q.Get("routing_key_from"); from {
	case "":
	case "ordering_key":
		fromOrderingKey = true
	default:
		return "", "", "", false, fmt.Errorf("destination %q: routing_key_from=%s, want ordering_key", dest, from)
	}
	if key == "" && exchange == "" {
		return "", "", "", false, fmt.Errorf("destination %q names neither an exchange nor a routing_key", dest)
	}
	q.Del("exchange")
	q.Del("routing_key")
	q.Del("routing_key_from")
	u.RawQuery = q.Encode()
	return u.String(), exchange, key, fromOrderingKey, nil
}

// conn returns the connection to server, dialing it if there is none.
func (a *Sender) conn(ctx context.Context, server string) (*amqpConn, error) {
	a.mu.Lock()
	c, ok := a.conns[server]
	a.mu.Unlock()
	if ok && !c.conn.IsClosed() {
		return c, nil
	}
	conn, err := within(ctx, func() (*amqp.Connection, error) { return amqp.DialConfig(server, a.cfg) },
		func(conn *amqp.Connection, err error) {
			if err != nil { // the broker's reason, for the next send to report
				a.mu.Lock()
				a.dialErr[server] = err
				a.mu.Unlock()
				return
			}
			conn.Close()
		})
	if err != nil {
		a.mu.Lock()
		last := a.dialErr[server]
		a.mu.Unlock()
		if last != nil && ctx.Err() != nil {
			return nil, fmt.Errorf("%w (the dial before: %v)", err, last)
		}
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.dialErr, server)
	if c, ok := a.conns[server]; ok && !c.conn.IsClosed() { // another send dialed meanwhile
		go conn.Close()
		return c, nil
	}
	c = &amqpConn{conn: conn, pool: make(chan *confirmChannel, 64)}
	go c.watchBlocked(conn.NotifyBlocked(make(chan amqp.Blocking, 4)))
	a.conns[server] = c
	return c, nil
}

// channel returns a confirm channel of c: one of its pool, or a new one.
func (c *amqpConn) channel(ctx context.Context) (*confirmChannel, error) {
	select {
	case cc := <-c.pool:
		if !cc.ch.IsClosed() {
			return cc, nil
		}
	default:
	}
	return within(ctx, func() (*confirmChannel, error) {
		ch, err := c.conn.Channel()
		if err != nil {
			return nil, err
		}
		if err := ch.Confirm(false); err != nil {
			go ch.Close()
			return nil, err
		}
		return &confirmChannel{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1)), closed: ch.NotifyClose(make(chan *amqp.Error, 1))}, nil
	}, func(cc *confirmChannel, err error) {
		if err == nil {
			discard(cc)
		}
	})
}

// within runs f and waits for it no longer than ctx: the broker's
// handshake and its answers to opening a channel wait for ever on a broker
// that stopped answering. What f returns after ctx ended is handed to
// late: a result to close, or the error.
func within[T any](ctx context.Context, f func() (T, error), late func(T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		go func() {
			r := <-done
			late(r.v, r.err)
		}()
		var zero T
		return zero, ctx.Err()
	}
}

func (c *amqpConn) put(cc *confirmChannel) {
	select {
	case c.pool <- cc:
	default:
		cc.ch.Close()
	}
}

// returned reports whether the broker returned the publish of key: the
// channel's returns are drained (one send at a time uses a channel, and a
// return comes before its confirmation, so any return here is this send's).
func (cc *confirmChannel) returned(key string) (amqp.Return, bool) {
	for {
		select {
		case ret, open := <-cc.returns:
			if !open { // the channel closed
				return amqp.Return{}, false
			}
			if ret.MessageId == key {
				return ret, true
			}
		default:
			return amqp.Return{}, false
		}
	}
}

// Send implements outbox.Sender.
func (a *Sender) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	server, exchange, key, fromOrderingKey, err := parseDestination(m.Destination)
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	if fromOrderingKey && m.OrderingKey != "" {
		key = m.OrderingKey
	}
	c, err := a.conn(ctx, server)
	if err != nil {
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("connect: %w", err)}
	}
	if err := c.blockedErr(); err != nil {
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	cc, err := c.channel(ctx)
	if err != nil {
		if ctx.Err() != nil { // the broker did not answer in time
			a.drop(server, c)
		}
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("open a channel: %w", err)}
	}
	headers := amqp.Table{}
	for k, v := range m.Headers {
		headers[k] = v
	}
	if m.OrderingKey != "" {
		headers[outbox.OrderingKeyHeader] = m.OrderingKey
	}
	// The publish's write blocks while the broker reads nothing (amqp091
	// looks at ctx only before it): wait for it no longer than ctx.
	conf, err := within(ctx, func() (*amqp.DeferredConfirmation, error) {
		return cc.ch.PublishWithDeferredConfirm(exchange, key, true, false, amqp.Publishing{
			MessageId: m.Key, DeliveryMode: amqp.Persistent, Headers: headers, Body: m.Payload,
			ContentType: m.Headers["Content-Type"],
		})
	}, func(*amqp.DeferredConfirmation, error) {})
	if err != nil {
		if ctx.Err() != nil { // the write did not finish in time: the connection is stuck
			a.drop(server, c)
		} else {
			discard(cc)
		}
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("publish: %w", err)}
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil && c.blockedErr() != nil {
		// Blocked: the broker holds the publish unread until the alarm
		// clears (it may then be confirmed and delivered: a duplicate the
		// receiver's idempotency absorbs). The connection is sound.
		discard(cc)
		return outbox.Result{Status: outbox.Pending, Err: c.blockedErr()}
	}
	if err != nil {
		// The broker did not confirm in time: it may have stopped
		// answering on this connection, and then closing a channel waits
		// for it for ever. Drop the connection.
		a.drop(server, c)
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("no confirm: %v", err)}
	}
	if !ok { // nacked, or the channel closed under the publish: not reused
		discard(cc)
		select {
		case cause := <-cc.closed:
			if cause != nil {
				return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("the broker closed the channel: %v", cause)}
			}
		default:
		}
		return outbox.Result{Status: outbox.Pending, Err: errors.New("the broker nacked the publish")}
	}
	ret, returned := cc.returned(m.Key)
	c.put(cc)
	if returned {
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("no queue takes it: the broker returned it from exchange %q with routing key %q (%d %s)",
			exchange, key, ret.ReplyCode, ret.ReplyText)}
	}
	return outbox.Result{Status: outbox.Sent}
}

// discard closes cc without waiting for the broker's answer: a send must
// not wait past its context for a broker that no longer answers.
func discard(cc *confirmChannel) { go cc.ch.Close() }

// drop forgets the connection c to server and closes it, waiting a second at
// most for the broker's answer (in the background): its channels end with
// it, and the next send dials again.
func (a *Sender) drop(server string, c *amqpConn) {
	a.mu.Lock()
	if a.conns[server] == c {
		delete(a.conns, server)
	}
	a.mu.Unlock()
	go c.conn.CloseDeadline(time.Now().Add(time.Second))
}

// Close closes the connections.
func (a *Sender) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, c := range a.conns {
		c.conn.Close()
		delete(a.conns, k)
	}
}
