package main

import (
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem/console"
)

// listenerTimeouts bound how long a peer may hold a connection of one of
// the command's listeners: a client that trickles its request, reads the
// answer slowly or keeps an idle connection open is cut off.
type listenerTimeouts struct {
	readHeader, read, write, idle time.Duration
}

// listenerTimeoutFlags adds --read-header-timeout, --read-timeout,
// --write-timeout and --idle-timeout to cmd, write defaulting to write.
func listenerTimeoutFlags(cmd *cobra.Command, write time.Duration) *listenerTimeouts {
	t := &listenerTimeouts{}
	f := cmd.Flags()
	f.DurationVar(&t.readHeader, "read-header-timeout", 10*time.Second, "time a client has to send a request's headers")
	f.DurationVar(&t.read, "read-timeout", time.Minute, "time a client has to send a whole request, body included")
	f.DurationVar(&t.write, "write-timeout", write, "time from the end of a request's headers to the end of its answer")
	f.DurationVar(&t.idle, "idle-timeout", time.Minute, "time an idle keep-alive connection is kept open")
	return t
}

// server is an http.Server of handler with these timeouts.
func (t listenerTimeouts) server(handler http.Handler) *http.Server {
	return &http.Server{Handler: handler, ReadHeaderTimeout: t.readHeader, ReadTimeout: t.read, WriteTimeout: t.write, IdleTimeout: t.idle}
}

// adminListener is how an operator's listener (the console, the admin
// listener of idem serve) is reached: the host names it answers to on
// loopback, and TLS.
type adminListener struct {
	allowedHosts    []string
	tlsCert, tlsKey string
}

// adminListenerFlags adds the flags of an operator's listener, named with
// prefix (as in --admin-tls-cert).
func adminListenerFlags(cmd *cobra.Command, prefix string) *adminListener {
	a := &adminListener{}
	f := cmd.Flags()
	f.StringSliceVar(&a.allowedHosts, prefix+"allowed-host", nil, "a host name, besides localhost and loopback addresses, a loopback listener answers to (repeatable; any other Host is refused, against DNS rebinding)")
	f.StringVar(&a.tlsCert, prefix+"tls-cert", "", "serve TLS with this certificate (PEM; with the key flag); the console's cookies are then Secure")
	f.StringVar(&a.tlsKey, prefix+"tls-key", "", "the TLS certificate's private key (PEM)")
	return a
}

func (a *adminListener) check() error {
	if (a.tlsCert == "") != (a.tlsKey == "") {
		return errors.New("the TLS certificate and key flags go together")
	}
	return nil
}

// handler is h as served on addr: on loopback, only to loopback names and
// the allowed hosts.
func (a *adminListener) handler(addr string, h http.Handler) http.Handler {
	if console.IsLoopback(addr) {
		return console.LoopbackHostOnly(h, a.allowedHosts)
	}
	return h
}

// serve serves srv on ln, with TLS when configured.
func (a *adminListener) serve(srv *http.Server, ln net.Listener) error {
	if a.tlsCert != "" {
		return srv.ServeTLS(ln, a.tlsCert, a.tlsKey)
	}
	return srv.Serve(ln)
}

// scheme is the URL scheme the listener answers.
func (a *adminListener) scheme() string {
	if a.tlsCert != "" {
		return "https"
	}
	return "http"
}
