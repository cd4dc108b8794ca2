//go:build !linux

package testenv

import (
	"errors"
	"net"
)

// listenHoldable listens on addr; outside Linux a cut proxy's address is
// not held (holdPort fails), and Restore listens on it anew, which fails
// where another socket took it meanwhile.
func listenHoldable(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

type portHold struct{}

func holdPort(string) (*portHold, error) { return nil, errors.ErrUnsupported }

func (*portHold) listen() (net.Listener, error) { return nil, errors.ErrUnsupported }

func (*portHold) release() {}
