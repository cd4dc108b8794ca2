package senders

import (
	"github.com/idemgo/idem/outbox"
)

// New returns a router with the HTTP, NATS and AMQP senders. Close the
// returned closer when done (it closes the broker connections).
func New(httpCfg HTTPConfig) (outbox.Router, func()) {
	h := NewHTTP(httpCfg)
	n := NewNATS()
	a := NewAMQP()
	as2 := NewAS2(h)
	return outbox.Router{"http": h, "https": h, "nats": n, "amqp": a, "amqps": a, "as2+http": as2, "as2+https": as2}, func() { n.Close(); a.Close() }
}
