package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/idemgo/idem/console"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
	"github.com/idemgo/idem/store/storeurl"
)

// adminTokenFlag adds --admin-token (default IDEM_ADMIN_TOKEN).
func adminTokenFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("admin-token", os.Getenv("IDEM_ADMIN_TOKEN"),
		"token a browser presents before changing anything through the console off loopback (default $IDEM_ADMIN_TOKEN)")
}

// mountConsole serves the console at / of mux, beside /metrics and
// /healthz, for a listener on addr.
func mountConsole(mux *http.ServeMux, addr string, cfg console.Config) error {
	cfg.Loopback = console.IsLoopback(addr)
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
postgres://) shows its records, its outbox and its inbox (processed_events) together.
On loopback (the default) writes need no token; elsewhere --admin-token.`,
		Args: cobra.NoArgs,
	}
	store := storeFlag(cmd)
	token := adminTokenFlag(cmd)
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8090", "address to serve on")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		s, err := storeurl.Open(ctx, *store, &storeurl.Options{SkipMigrate: true})
		if err != nil {
			return err
		}
		defer s.Close()
		cfg := console.Config{Store: s, Token: *token}
		if spec, err := storeurl.Parse(*store); err == nil && (spec.Kind == storeurl.SQLite || spec.Kind == storeurl.Postgres) {
			ob, closeOutbox, err := openOutbox(ctx, *store)
			if err != nil {
				return err
			}
			defer closeOutbox()
			cfg.Outbox = ob
			ib, closeInbox, err := openConsoleInbox(ctx, *store)
			if err != nil {
				return err
			}
			defer closeInbox()
			cfg.Inbox = ib
		}
		mux := http.NewServeMux()
		if err := mountConsole(mux, listen, cfg); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		fmt.Fprintf(cmd.ErrOrStderr(), "idem console on http://%s\n", ln.Addr())
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	return cmd
}

// openConsoleInbox opens the inbox of a SQL store URL for the console.
func openConsoleInbox(ctx context.Context, raw string) (console.Inbox, func(), error) {
	d, err := openSQLDB(ctx, raw, "inbox")
	if err != nil {
		return nil, nil, err
	}
	table := "processed_events"
	if d.schema != "" {
		table = d.schema + "." + table
	}
	var ib console.Inbox
	if d.db != nil {
		ib, err = inbox.New[*sql.Tx](databasesql.New(d.db, sqldriver.SQLite), inbox.Config{Table: table})
	} else {
		ib, err = inbox.New[pgx.Tx](pgxv5.New(d.pool, d.pgOpts...), inbox.Config{Table: table})
	}
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return ib, d.Close, nil
}
