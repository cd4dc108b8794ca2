package main

import (
	"net/http"
	"time"

	"github.com/spf13/cobra"
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
