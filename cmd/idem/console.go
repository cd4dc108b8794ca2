package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem/console"
	"github.com/idemgo/idem/internal/redact"
	"github.com/idemgo/idem/store/storeurl"
)

// adminTokenFlag adds --admin-token (default IDEM_ADMIN_TOKEN).
func adminTokenFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("admin-token", os.Getenv("IDEM_ADMIN_TOKEN"),
		"token a browser presents before changing anything through the console off loopback (default $IDEM_ADMIN_TOKEN)")
}

// mountConsole serves the console at / of mux, beside /metrics and
// /healthz, for a listener on addr reached as al says.
func mountConsole(mux *http.ServeMux, addr string, al *adminListener, cfg console.Config) error {
	cfg.Loopback = console.IsLoopback(addr)
	cfg.AllowedHosts, cfg.SecureCookies = al.allowedHosts, al.tlsCert != ""
	c, err := console.New(cfg)
	if err != nil {
		return fmt.Errorf("the console on %s: %w (set --admin-token or IDEM_ADMIN_TOKEN, or listen on loopback)", addr, err)
	}
	mux.Handle("/", c)
	return nil
}

func newConsoleCmd() *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "console --store URL [--listen ADDR]",
		Short: "The operator's console in the browser: records, outbox and inbox of a store",
		Long: `Serves the console: an overview of records by state and outbox rows by status, the
keys (filter by scope, prefix and state; forget or release one), the outbox (filter by
status and destination; retry one, or every dead message to a destination), a message's
page, and a search that shows everything known of a key. A SQL store URL (sqlite:,
postgres://) shows its records, its outbox and its inbox (processed_events) together;
like every command that opens a SQL store, it first creates or upgrades idem's tables there
(records and outbox: idem migrate).
On loopback (the default) it answers only to loopback host names (and --allowed-host)
and needs no token; elsewhere every page but the sign-in needs --admin-token, sign-in
attempts are rate-limited, and --tls-cert/--tls-key serve it over TLS with Secure cookies.`,
		Args: cobra.NoArgs,
	}
	store := storeFlag(cmd)
	token := adminTokenFlag(cmd)
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8090", "address to serve on")
	timeouts := listenerTimeoutFlags(cmd, time.Minute)
	al := adminListenerFlags(cmd, "")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := al.check(); err != nil {
			return err
		}
		ctx := cmd.Context()
		s, err := storeurl.Open(ctx, *store, nil) // migrates the records
		if err != nil {
			return err
		}
		defer s.Close()
		cfg := console.Config{Store: s, Token: *token, StoreURL: redact.URL(*store)}
		if spec, err := storeurl.Parse(*store); err == nil && (spec.Kind == storeurl.SQLite || spec.Kind == storeurl.Postgres) {
			ob, closeOutbox, err := openOutbox(ctx, *store)
			if err != nil {
				return err
			}
			defer closeOutbox()
			if err := ob.Migrate(ctx); err != nil {
				return err
			}
			cfg.Outbox = ob
			ib, closeInbox, err := openInbox(ctx, *store, "")
			if err != nil {
				return err
			}
			defer closeInbox()
			cfg.Inbox = ib
		}
		mux := http.NewServeMux()
		if err := mountConsole(mux, listen, al, cfg); err != nil {
			return err
		}
		return serveUntilDone(ctx, listen, al.handler(listen, mux), 5*time.Second, *timeouts, al, func(addr net.Addr) {
			fmt.Fprintf(cmd.ErrOrStderr(), "idem console on %s://%s\n", al.scheme(), addr)
		})
	}
	return cmd
}

// serveUntilDone serves handler on addr until ctx ends, then shuts down
// within grace; started hears the address once it listens.
func serveUntilDone(ctx context.Context, addr string, handler http.Handler, grace time.Duration, timeouts listenerTimeouts, al *adminListener, started func(net.Addr)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := timeouts.server(handler)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	started(ln.Addr())
	serve := srv.Serve
	if al != nil {
		serve = func(ln net.Listener) error { return al.serve(srv, ln) }
	}
	if err := serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
