package testenv

// heldPorts are the addresses of a server a test killed, held until the
// server starts again on them: while it is down, another socket could take
// a port (a connection given it as its ephemeral port, another test's
// server picking a free port), and the restart would fail. A held address
// refuses connections, as the dead server's did; the server binds it
// alongside the hold (SO_REUSEADDR, which the servers set), and the hold is
// released once the server listens. Best effort: an address that cannot be
// held (outside Linux) is left as it is.
type heldPorts []*portHold

// holdPorts holds each of addrs (host:port) it can.
func holdPorts(addrs ...string) heldPorts {
	var h heldPorts
	for _, a := range addrs {
		if p, err := holdPort(a); err == nil {
			h = append(h, p)
		}
	}
	return h
}

// release frees the held addresses.
func (h heldPorts) release() {
	for _, p := range h {
		p.release()
	}
}
