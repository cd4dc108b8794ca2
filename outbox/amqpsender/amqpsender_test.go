package amqpsender_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/amqpsender"
	"github.com/idemgo/idem/outbox/sendertest"
)

// TestConformance: the receiver is a RabbitMQ queue; AMQP has no duplicate
// answer and the queue keeps every attempt (the consumer dedups on
// message-id, as idem's amqpidem does).
func TestConformance(t *testing.T) {
	conn, err := amqp.DialConfig(testenv.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	testenv.Need(t, "RabbitMQ", testenv.AMQPURL, err)
	defer conn.Close()
	s := amqpsender.New(amqp.Config{})
	defer s.Close()
	sendertest.Run(t, sendertest.Target{
		Sender: s,
		Destination: func(t *testing.T) (string, func() []sendertest.Delivery) {
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ch.Close() })
			q := testenv.RandomName("idemsend.")
			if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var got []sendertest.Delivery
			return testenv.AMQPURL + "?routing_key=" + q, func() []sendertest.Delivery {
				mu.Lock()
				defer mu.Unlock()
				for {
					d, ok, err := ch.Get(q, true)
					if err != nil {
						t.Fatal(err)
					}
					if !ok {
						return append([]sendertest.Delivery(nil), got...)
					}
					got = append(got, sendertest.Delivery{KeyField: d.MessageId, Payload: d.Body})
				}
			}
		},
		KeyField:    func(key string) string { return key },
		Unreachable: func(*testing.T) string { return "amqp://guest:guest@127.0.0.1:1/?routing_key=orders" },
		Refused: func(*testing.T) []string {
			return []string{testenv.AMQPURL, "amqp:///?routing_key=orders"}
		},
	})
}

func TestAMQPMessageID(t *testing.T) {
	ch, q := testenv.AMQPQueue(t, "idemout.")
	s := amqpsender.New(amqp.Config{})
	defer s.Close()
	res := s.Send(context.Background(), &outbox.Message{Key: "ORD-7", Destination: testenv.AMQPURL + "?routing_key=" + q, Payload: []byte("order 7")})
	if res.Status != outbox.Sent {
		t.Fatalf("send: %s %v", res.Status, res.Err)
	}
	d, ok, err := ch.Get(q, true)
	if err != nil || !ok || d.MessageId != "ORD-7" || string(d.Body) != "order 7" || d.DeliveryMode != amqp.Persistent {
		t.Fatalf("delivered %+v %v %v", d.MessageId, ok, err)
	}
	if res := s.Send(context.Background(), &outbox.Message{Key: "k", Destination: testenv.AMQPURL}); res.Status != outbox.Dead {
		t.Fatalf("no exchange or routing key: %s", res.Status)
	}
}

// TestUnroutableIsNotSent: RabbitMQ confirms a publish that no queue takes
// (no queue of that name, no binding of the exchange) — and drops it. Such
// a message stays pending (retried, with the reason), and is delivered once
// the queue exists; it is never recorded sent. So does a message to an
// exchange that does not exist (the broker closes the channel).
func TestUnroutableIsNotSent(t *testing.T) {
	conn, err := amqp.DialConfig(testenv.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	testenv.Need(t, "RabbitMQ", testenv.AMQPURL, err)
	defer conn.Close()
	ch, _ := conn.Channel()
	q, exchange := testenv.RandomName("idemout."), testenv.RandomName("idemout.x.")
	if err := ch.ExchangeDeclare(exchange, "direct", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer ch.ExchangeDelete(exchange, false, false)
	s := amqpsender.New(amqp.Config{})
	defer s.Close()
	ctx := context.Background()
	for _, dest := range []string{testenv.AMQPURL + "?routing_key=" + q, testenv.AMQPURL + "?exchange=" + exchange + "&routing_key=" + q} {
		m := &outbox.Message{Key: "ORD-" + dest, Destination: dest, Payload: []byte("order")}
		res := s.Send(ctx, m)
		if res.Status != outbox.Pending || res.Err == nil || !strings.Contains(res.Err.Error(), "no queue") {
			t.Fatalf("%s, no queue to take it: %s %v; want pending, no queue", dest, res.Status, res.Err)
		}
		// The sender goes on working on the same channels.
		if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, q, exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		if res := s.Send(ctx, m); res.Status != outbox.Sent {
			t.Fatalf("%s, the queue declared: %s %v", dest, res.Status, res.Err)
		}
		d, ok, err := ch.Get(q, true)
		if err != nil || !ok || d.MessageId != m.Key {
			t.Fatalf("%s: delivered %q %v %v", dest, d.MessageId, ok, err)
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Fatal(err)
		}
	}
	m := &outbox.Message{Key: "ORD-9", Destination: testenv.AMQPURL + "?exchange=" + exchange + ".missing&routing_key=" + q, Payload: []byte("order")}
	if res := s.Send(ctx, m); res.Status != outbox.Pending || res.Err == nil || !strings.Contains(res.Err.Error(), "NOT_FOUND") {
		t.Fatalf("to an exchange that does not exist: %s %v; want pending, NOT_FOUND", res.Status, res.Err)
	}
}

// TestCredentialsAreTheSenders: the sender's own credentials
// (amqpsender.New(amqp.Config{SASL: …})) are the ones it logs in with,
// whatever user a destination's URL names — an outbox row needs no secret.
// Without them the same destination, with a user the broker does not know,
// is retried with the broker's refusal (403, "username or password not allowed").
func TestCredentialsAreTheSenders(t *testing.T) {
	ch, q := testenv.AMQPQueue(t, "idemout.")
	stranger, user, password := testenv.AMQPStranger(t)
	relay := &amqp.PlainAuth{Username: user, Password: password}
	ctx := context.Background()
	m := &outbox.Message{Key: "ORD-1", Destination: stranger + "?routing_key=" + q, Payload: []byte("order")}

	anonymous := amqpsender.New(amqp.Config{})
	defer anonymous.Close()
	if res := anonymous.Send(ctx, m); res.Status != outbox.Pending || res.Err == nil || !strings.Contains(res.Err.Error(), "not allowed") {
		t.Fatalf("with the row's unknown user: %s %v; want pending, not allowed", res.Status, res.Err)
	}
	s := amqpsender.New(amqp.Config{SASL: []amqp.Authentication{relay}})
	defer s.Close()
	if res := s.Send(ctx, m); res.Status != outbox.Sent {
		t.Fatalf("with the sender's credentials: %s %v", res.Status, res.Err)
	}
	if d, ok, err := ch.Get(q, true); err != nil || !ok || d.MessageId != m.Key {
		t.Fatalf("delivered %q %v %v", d.MessageId, ok, err)
	}
}

// TestParseDestinationKeepsConnectionParameters: a destination's query
// names the exchange and routing key, and may carry amqp091-go's connection
// parameters — the TLS files of an amqps:// broker with a private CA or
// client certificates (cacertfile, certfile, keyfile,
// server_name_indication), heartbeat, connection_timeout, auth_mechanism —
// which stay in the server URL the sender dials.
func TestParseDestinationKeepsConnectionParameters(t *testing.T) {
	server, exchange, key, err := amqpsender.ParseDestination("amqps://rabbit.example:5671/orders?exchange=ex&routing_key=rk&cacertfile=/etc/idem/ca.pem&certfile=/etc/idem/relay.pem&keyfile=/etc/idem/relay.key&server_name_indication=rabbit.internal&heartbeat=5")
	if err != nil || exchange != "ex" || key != "rk" {
		t.Fatalf("exchange %q, routing key %q, %v", exchange, key, err)
	}
	u, err := amqp.ParseURI(server)
	if err != nil {
		t.Fatal(err)
	}
	if u.CACertFile != "/etc/idem/ca.pem" || u.CertFile != "/etc/idem/relay.pem" || u.KeyFile != "/etc/idem/relay.key" || u.ServerName != "rabbit.internal" || u.Vhost != "orders" || !strings.Contains(server, "heartbeat=5") {
		t.Fatalf("the server URL %q lost its connection parameters: %+v", server, u)
	}
	if server, _, _, _ := amqpsender.ParseDestination("amqp://h/?routing_key=rk"); server != "amqp://h/" {
		t.Fatalf("a destination without connection parameters dials %q, want amqp://h/", server)
	}
}

// TestTLSWithClientCertificates: a RabbitMQ node with a TLS listener from a
// private CA that wants client certificates. The destination names the CA,
// and the relay's certificate and key, as amqp091-go's URL parameters:
// without the certificate the broker refuses the handshake and the message
// stays pending; with it, it is delivered.
func TestTLSWithClientCertificates(t *testing.T) {
	files := testenv.NewTLSFiles(t)
	node := testenv.StartRabbitMQTLS(t, files)
	const q = "orders"
	ch := node.DurableQueue(t, q)
	s := amqpsender.New(amqp.Config{})
	defer s.Close()
	ctx := context.Background()
	dest := node.TLSURL + "?routing_key=" + q + "&cacertfile=" + files.CA
	m := &outbox.Message{Key: "ORD-1", Destination: dest, Payload: []byte("order")}
	if res := s.Send(ctx, m); res.Status != outbox.Pending || res.Err == nil {
		t.Fatalf("without a client certificate: %s %v; want pending, refused", res.Status, res.Err)
	}
	m.Destination = dest + "&certfile=" + files.Cert + "&keyfile=" + files.Key
	testenv.Eventually(t, 30*time.Second, "sent with the client certificate", func() error { // as a relay retries
		if res := s.Send(ctx, m); res.Status != outbox.Sent {
			return fmt.Errorf("%s %v", res.Status, res.Err)
		}
		return nil
	})
	if d, ok, err := ch.Get(q, true); err != nil || !ok || d.MessageId != m.Key {
		t.Fatalf("delivered %q %v %v", d.MessageId, ok, err)
	}
}

// TestOrderingKey: the ordering key travels in the Idem-Ordering-Key
// header, and with routing_key_from=ordering_key it is the routing key (on
// the default exchange: the queue of that name; a message without one takes
// the destination's routing_key).
func TestOrderingKey(t *testing.T) {
	ch, q := testenv.AMQPQueue(t, "idemout.")
	_, fallback := testenv.AMQPQueue(t, "idemout.")
	s := amqpsender.New(amqp.Config{})
	defer s.Close()
	dest := testenv.AMQPURL + "?routing_key=" + fallback + "&routing_key_from=ordering_key"
	for _, m := range []*outbox.Message{{Key: "ORD-1", Destination: dest, OrderingKey: q}, {Key: "ORD-2", Destination: dest}} {
		if res := s.Send(context.Background(), m); res.Status != outbox.Sent {
			t.Fatalf("%s: %s %v", m.Key, res.Status, res.Err)
		}
	}
	if d, ok, err := ch.Get(q, true); err != nil || !ok || d.MessageId != "ORD-1" || d.Headers[outbox.OrderingKeyHeader] != q {
		t.Fatalf("the queue of the ordering key got %q %v %v (headers %v)", d.MessageId, ok, err, d.Headers)
	}
	if d, ok, err := ch.Get(fallback, true); err != nil || !ok || d.MessageId != "ORD-2" {
		t.Fatalf("the destination's queue got %q %v %v", d.MessageId, ok, err)
	}
	if res := s.Send(context.Background(), &outbox.Message{Key: "ORD-3", Destination: testenv.AMQPURL + "?routing_key=x&routing_key_from=header"}); res.Status != outbox.Dead {
		t.Fatalf("routing_key_from=header: %s %v", res.Status, res.Err)
	}
}
