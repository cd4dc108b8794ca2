// Package amqpsender delivers outbox messages to an AMQP 0-9-1 broker
// (RabbitMQ): a persistent publish with publisher confirms to
// amqp://…?exchange=E&routing_key=R, with the key as the message-id.
package amqpsender

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/outbox"
)

// Sender publishes with publisher confirms: destination
// amqp://USER:PASS@HOST:PORT/VHOST?exchange=E&routing_key=R (exchange ""
// is the default exchange, routing to the queue named R), the key in the
// message-id property, persistent delivery. A confirmed publish is sent; a
// nack or a lost connection is retried. One connection per server, one
// confirm channel per send at a time.
type Sender struct {
	mu    sync.Mutex
	conns map[string]*amqpConn
}

type amqpConn struct {
	conn *amqp.Connection
	pool chan *amqp.Channel
}

// New returns the AMQP sender.
func New() *Sender { return &Sender{conns: map[string]*amqpConn{}} }

// ParseDestination splits a destination into the server URL, exchange and routing
// key.
func ParseDestination(dest string) (server, exchange, key string, err error) {
	u, err := url.Parse(dest)
	if err != nil || u.Host == "" {
		return "", "", "", fmt.Errorf("want amqp://…/VHOST?exchange=E&routing_key=R, got %q", dest)
	}
	q := u.Query()
	exchange, key = q.Get("exchange"), q.Get("routing_key")
	if key == "" && exchange == "" {
		return "", "", "", fmt.Errorf("destination %q names neither an exchange nor a routing_key", dest)
	}
	u.RawQuery = ""
	return u.String(), exchange, key, nil
}

func (a *Sender) conn(server string) (*amqpConn, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.conns[server]; ok && !c.conn.IsClosed() {
		return c, nil
	}
	conn, err := amqp.Dial(server)
	if err != nil {
		return nil, err
	}
	c := &amqpConn{conn: conn, pool: make(chan *amqp.Channel, 64)}
	a.conns[server] = c
	return c, nil
}

func (c *amqpConn) channel() (*amqp.Channel, error) {
	select {
	case ch := <-c.pool:
		if !ch.IsClosed() {
			return ch, nil
		}
	default:
	}
	ch, err := c.conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, err
	}
	return ch, nil
}

func (c *amqpConn) put(ch *amqp.Channel) {
	select {
	case c.pool <- ch:
	default:
		ch.Close()
	}
}

// Send implements outbox.Sender.
func (a *Sender) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	server, exchange, key, err := ParseDestination(m.Destination)
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	c, err := a.conn(server)
	if err != nil {
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	ch, err := c.channel()
	if err != nil {
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	headers := amqp.Table{}
	for k, v := range m.Headers {
		headers[k] = v
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, amqp.Publishing{
		MessageId: m.Key, DeliveryMode: amqp.Persistent, Headers: headers, Body: m.Payload,
		ContentType: m.Headers["Content-Type"],
	})
	if err != nil {
		ch.Close()
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil {
		ch.Close()
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("no confirm: %v", err)}
	}
	c.put(ch)
	if !ok {
		return outbox.Result{Status: outbox.Pending, Err: errors.New("the broker nacked the publish")}
	}
	return outbox.Result{Status: outbox.Sent}
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
