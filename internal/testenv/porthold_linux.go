package testenv

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenHoldable listens on addr with SO_REUSEPORT, so holdPort can bind
// the address while the listener still has it: the address is never free
// between a Cut and its Restore.
func listenHoldable(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return setReusePort(c)
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

func setReusePort(c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	return serr
}

// portHold is a TCP socket bound to an address and not listening on it:
// connections to the address are refused, and no other socket can take it
// — not a client's connection given the port as its ephemeral port (the
// kernel skips ports bound explicitly), nor another listener.
type portHold struct{ fd int }

// holdPort binds a socket to addr (an IPv4 host:port that a listener of
// listenHoldable may still have).
func holdPort(addr string) (*portHold, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("hold %s: not an IPv4 address and port", addr)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("hold %s: %w", addr, err)
	}
	for _, opt := range []int{syscall.SO_REUSEADDR, unix.SO_REUSEPORT} {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, opt, 1); err != nil {
			syscall.Close(fd)
			return nil, fmt.Errorf("hold %s: %w", addr, err)
		}
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("hold %s: %w", addr, err)
	}
	return &portHold{fd: fd}, nil
}

// listen turns the held socket into a listener; h is spent.
func (h *portHold) listen() (net.Listener, error) {
	if err := syscall.Listen(h.fd, syscall.SOMAXCONN); err != nil {
		h.release()
		return nil, err
	}
	f := os.NewFile(uintptr(h.fd), "proxy")
	defer f.Close() // FileListener holds a duplicate
	return net.FileListener(f)
}

// release closes the held socket; the address is free again.
func (h *portHold) release() { syscall.Close(h.fd) }
