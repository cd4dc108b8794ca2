package senders

import (
	"github.com/nats-io/nats.go"

	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/amqpsender"
	"github.com/idemgo/idem/outbox/as2sender"
	"github.com/idemgo/idem/outbox/httpsender"
	"github.com/idemgo/idem/outbox/natssender"
)

// New returns a router with every transport's sender: HTTP(S), NATS (its
// connections opened with natsOpts: see natssender.New), AMQP and AS2 over
// HTTP(S). Close the returned closer when done (it closes the
// broker connections). A program that sends over one transport only
// builds its own outbox.Router from that transport's package and links
// nothing of the others.
func New(httpCfg httpsender.Config, natsOpts ...nats.Option) (outbox.Router, func()) {
	h := httpsender.New(httpCfg)
	n := natssender.New(natsOpts...)
	a := amqpsender.New()
	as2 := as2sender.New(h.Client())
	return outbox.Router{"http": h, "https": h, "nats": n, "amqp": a, "amqps": a, "as2+http": as2, "as2+https": as2}, func() { n.Close(); a.Close() }
}
