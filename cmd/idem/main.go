package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/storeurl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		if code, ok := err.(exitCode); ok {
			os.Exit(int(code))
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "idem") {
			msg = "idem: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}

// exitCode ends the command with a status and no further message.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "idem",
		Short:         "Make retries harmless: idempotency keys, leases and replays on any store",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newDemoCmd(), newServeCmd(), newKeysCmd(), newOutboxCmd(), newRelayCmd(), newEDICmd(), newMigrateCmd(), newBenchCmd())
	return root
}

// storeFlag adds --store to cmd and returns where its value lands.
func storeFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("store", storeurl.Default, "store URL: memory:, sqlite:PATH, postgres://… or redis://…")
}

func openStore(ctx context.Context, url string) (idem.Store, error) {
	return storeurl.Open(ctx, url, nil)
}

func newMigrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the store's schema",
		Args:  cobra.NoArgs,
	}
	store := storeFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		s, err := openStore(cmd.Context(), *store)
		if err != nil {
			return err
		}
		defer s.Close()
		m, ok := s.(idem.Migrator)
		if !ok {
			fmt.Fprintf(cmd.OutOrStdout(), "%s has no schema to migrate\n", *store)
			return nil
		}
		if err := m.Migrate(cmd.Context()); err != nil {
			return err
		}
		if spec, _ := storeurl.Parse(*store); spec.Kind == storeurl.SQLite || spec.Kind == storeurl.Postgres {
			ob, closeFn, err := openOutbox(cmd.Context(), *store)
			if err != nil {
				return err
			}
			defer closeFn()
			if err := ob.Migrate(cmd.Context()); err != nil {
				return err
			}
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s: schema up to date (idempotency records and outbox)\n", *store)
		return nil
	}
	return cmd
}
