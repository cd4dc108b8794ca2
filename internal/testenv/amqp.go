package testenv

import (
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQPQueue connects to the test RabbitMQ (or skips: see Need), declares a
// queue of its own named prefix+random, deleted when its last consumer goes,
// and returns a channel to read it with; both are closed when the test ends.
func AMQPQueue(t testing.TB, prefix string) (*amqp.Channel, string) {
	t.Helper()
	q := RandomName(prefix)
	return amqpChannel(t, AMQPURL, q, false), q
}

// DurableQueue connects to the broker at url (a node of the test's own),
// declares the durable queue name and returns a channel to publish to it or
// read it with; the connection closes when the test ends.
func (r *RabbitMQ) DurableQueue(t testing.TB, name string) *amqp.Channel {
	t.Helper()
	return amqpChannel(t, r.URL, name, true)
}

func amqpChannel(t testing.TB, url, queue string, durable bool) *amqp.Channel {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	Need(t, "RabbitMQ", url, err)
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, durable, !durable, false, false, nil); err != nil {
		t.Fatal(err)
	}
	return ch
}

// AMQPStranger returns AMQPURL with a user and password the broker does not
// know in place of its own, and the user and password it had: for tests
// of credentials that come from elsewhere than the URL.
func AMQPStranger(t testing.TB) (stranger, user, password string) {
	t.Helper()
	u, err := url.Parse(AMQPURL)
	if err != nil || u.User == nil {
		t.Fatalf("IDEM_TEST_AMQP_URL %q names no user", AMQPURL)
	}
	user = u.User.Username()
	password, _ = u.User.Password()
	u.User = url.UserPassword("idem-nobody", "row-s3cret")
	return u.String(), user, password
}
