package senders

import (
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/amqpsender"
	"github.com/idemgo/idem/outbox/as2sender"
	"github.com/idemgo/idem/outbox/httpsender"
	"github.com/idemgo/idem/outbox/kafkasender"
	"github.com/idemgo/idem/outbox/natssender"
	"github.com/idemgo/idem/outbox/sqssender"
)

// Config configures every transport's sender. The zero value works: no
// timeout beyond httpsender's default, anonymous NATS, AMQP with the
// destination's user and password (or guest/guest).
type Config struct {
	HTTP httpsender.Config
	// NATS are the options every NATS connection is opened with
	// (credentials, TLS, an error handler): see natssender.New.
	NATS []nats.Option
	// AMQP is how every AMQP connection is opened (SASL credentials, which
	// take precedence over a destination's user and password, TLS): see
	// amqpsender.New.
	AMQP amqp.Config
	// Kafka configures the Kafka producer (TLS, SASL, the record key): see
	// kafkasender.Config.
	Kafka kafkasender.Config
	// SQS configures the Amazon SQS sender (its client; by default the
	// standard AWS configuration): see sqssender.Config.
	SQS sqssender.Config
}

// New returns a router with every transport's sender: HTTP(S), NATS, AMQP,
// Kafka, SQS and AS2 over HTTP(S). Close the returned closer when done (it closes the
// broker connections). A program that sends over one transport only
// builds its own outbox.Router from that transport's package and links
// nothing of the others.
func New(cfg Config) (outbox.Router, func()) {
	h := httpsender.New(cfg.HTTP)
	n := natssender.New(cfg.NATS...)
	a := amqpsender.New(cfg.AMQP)
	k := kafkasender.New(cfg.Kafka)
	as2 := as2sender.New(h.Client())
	return outbox.Router{"http": h, "https": h, "nats": n, "amqp": a, "amqps": a, "kafka": k, "sqs": sqssender.New(cfg.SQS),
			"as2+http": as2, "as2+https": as2},
		func() { n.Close(); a.Close(); k.Close() }
}
