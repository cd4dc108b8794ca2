// Package natssender delivers outbox messages to NATS JetStream: a publish
// to nats://HOST/SUBJECT with the key in Nats-Msg-Id, so the stream's
// duplicate window drops a resend; a "duplicate" PubAck counts as
// delivered.
package natssender

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem/outbox"
)

// Sender publishes to JetStream: destination nats://HOST:PORT/SUBJECT, the key
// in Nats-Msg-Id, so the stream's duplicate window drops a retry of a publish
// that did arrive (PubAck.Duplicate, reported as sent). One connection per
// server, shared.
type Sender struct {
	opts  []nats.Option
	mu    sync.Mutex
	conns map[string]*natsConn
}

type natsConn struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// New returns the NATS sender. opts are added to every connection it opens:
// credentials (nats.UserCredentials, nats.Token, nats.UserInfo), TLS
// (nats.RootCAs, nats.ClientCert), an ErrorHandler for the connections'
// asynchronous errors (nats.go prints them to standard error otherwise) —
// so that secrets live in the relay's configuration, not in the destination
// of every outbox row.
func New(opts ...nats.Option) *Sender {
	return &Sender{opts: opts, conns: map[string]*natsConn{}}
}

func (n *Sender) conn(server string) (*natsConn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.conns[server]; ok && !c.nc.IsClosed() {
		return c, nil
	}
	nc, err := nats.Connect(server, append([]nats.Option{nats.Name("idem relay"), nats.MaxReconnects(-1)}, n.opts...)...)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c := &natsConn{nc, js}
	n.conns[server] = c
	return c, nil
}

// ParseDestination splits nats://HOST:PORT/SUBJECT into the server URL and subject.
func ParseDestination(dest string) (server, subject string, err error) {
	u, err := url.Parse(dest)
	if err != nil || u.Host == "" {
		return "", "", fmt.Errorf("want nats://HOST[:PORT]/SUBJECT, got %q", dest)
	}
	subject = strings.TrimPrefix(u.Path, "/")
	if subject == "" || strings.ContainsAny(subject, " \t/") {
		return "", "", fmt.Errorf("want nats://HOST[:PORT]/SUBJECT with a dotted subject, got %q", dest)
	}
	u.Path, u.RawQuery = "", ""
	return u.String(), subject, nil
}

// Send implements outbox.Sender.
func (n *Sender) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	server, subject, err := ParseDestination(m.Destination)
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	c, err := n.conn(server)
	if err != nil {
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	msg := nats.NewMsg(subject)
	msg.Data = m.Payload
	for k, v := range m.Headers {
		msg.Header.Set(k, v)
	}
	msg.Header.Set(nats.MsgIdHdr, m.Key)
	if m.OrderingKey != "" {
		msg.Header.Set(outbox.OrderingKeyHeader, m.OrderingKey)
	}
	ack, err := c.js.PublishMsg(ctx, msg)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("no stream takes %s: %v", subject, err)}
		}
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	if ack.Duplicate {
		return outbox.Result{Status: outbox.Sent, Err: errors.New("JetStream reported a duplicate: delivered earlier")}
	}
	return outbox.Result{Status: outbox.Sent}
}

// Close closes the connections.
func (n *Sender) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, c := range n.conns {
		c.nc.Close()
		delete(n.conns, k)
	}
}
