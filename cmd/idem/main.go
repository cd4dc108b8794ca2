package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem/internal/sqlmigrate"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/mysqlstore"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/sqlitestore"
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
	root.AddCommand(newDemoCmd(), newServeCmd(), newKeysCmd(), newOutboxCmd(), newRelayCmd(), newEDICmd(), newAS2Cmd(), newInboxCmd(), newConsoleCmd(), newMigrateCmd(), newBenchCmd(), newVersionCmd())
	return root
}

// storeFlag adds --store to cmd and returns where its value lands.
func storeFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("store", storeurl.Default, "store URL: memory:, sqlite:PATH, postgres://…, mysql://…, redis://… or dynamodb://TABLE")
}

func openStore(ctx context.Context, url string) (store.Store, error) {
	return storeurl.Open(ctx, url, nil)
}

// redisNote is what idem migrate says of a Redis store.
const redisNote = `Its records expire by themselves (a TTL each), and each
transition is one call of a Redis function: idem migrate loads the function library on every
master (FUNCTION LOAD), and a process loads it too where a call finds it missing; a user the ACL
denies FCALL or FUNCTION gets the same Lua as scripts (EVALSHA). Buckets (idem_buckets=N in the
store URL) keep many records per hash: turn them on in every process that shares a key prefix at
once, and keep N (like the prefix, it says where a record is); records written before are moved
into their bucket by their next transition. Records with results longer than 28 bytes need the
server's hash-max-listpack-value raised to 128 for the compact layout.`

// migrateLogger writes idem migrate's warnings to the command's standard
// error.
func migrateLogger(cmd *cobra.Command) *log.Logger {
	return log.New(cmd.ErrOrStderr(), "idem migrate: ", 0)
}

func newMigrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate [--status | --print]",
		Short: "Create or upgrade the store's schema (records and outbox) and print its versions",
		Long: `Applies the missing numbered migrations of the idempotency records and of the outbox, each
in one transaction under the migration lock (an advisory lock on PostgreSQL, BEGIN IMMEDIATE on
SQLite), and prints the versions recorded in idem_migrations. Any number of processes may run it
at once. Every other command that opens a SQL store migrates it the same way at start, so
containers that start together all succeed; --status only prints.

--print writes the SQL instead, without connecting: every migration in its own transaction,
with the row of idem_migrations that records it, for administrators who apply schema
changes themselves. idem then finds the versions applied and runs none of them again.

Redis has no schema. ` + redisNote + `

It also reads the server's settings and warns, on standard error, of those under which a crash
loses acknowledged records (the store's ServerWarnings: a Redis without an append-only file,
a PostgreSQL with fsync off, …).`,
		Args: cobra.NoArgs,
	}
	st := storeFlag(cmd)
	status := cmd.Flags().Bool("status", false, "print the applied versions without migrating")
	print := cmd.Flags().Bool("print", false, "print the SQL of every migration instead of applying it (no connection)")
	cmd.MarkFlagsMutuallyExclusive("status", "print")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		if *print {
			return printMigrations(ctx, cmd.OutOrStdout(), *st)
		}
		spec, err := storeurl.Parse(*st)
		if err != nil {
			return err
		}
		var conn sqlmigrate.Conn
		var schema string
		switch spec.Kind {
		case storeurl.SQLite:
			db, err := sqlitestore.OpenDB(ctx, spec.Path, sqlitestore.DBOptions{Synchronous: spec.Query.Get("synchronous"), BusyTimeout: 10 * time.Second})
			if err != nil {
				return err
			}
			defer db.Close()
			conn = databasesql.New(db, sqldriver.SQLite)
		case storeurl.Postgres:
			s, err := storeurl.Open(ctx, *st, &storeurl.Options{SkipMigrate: true})
			if err != nil {
				return err
			}
			defer s.Close()
			pg := s.(*pgstore.Store)
			conn, schema = pgxv5.New(pg.Pool()), pg.Schema()
		case storeurl.MySQL:
			s, err := storeurl.Open(ctx, *st, &storeurl.Options{SkipMigrate: true})
			if err != nil {
				return err
			}
			defer s.Close()
			conn = databasesql.New(s.(*mysqlstore.Store).DB(), sqldriver.MySQL)
		case storeurl.Redis:
			fmt.Fprintf(cmd.OutOrStdout(), "%s has no schema to migrate. %s\n", *st, redisNote)
			s, err := openStore(ctx, *st)
			if err != nil {
				return err
			}
			defer s.Close()
			logServerWarnings(ctx, s, migrateLogger(cmd))
			if rs, ok := s.(*redisstore.Store); ok {
				if err := rs.LoadFunctions(ctx); err != nil {
					migrateLogger(cmd).Printf("warning: the function library was not loaded (%v): each process loads it where its calls find it missing, or sends scripts where its user may not", err)
				} else {
					fmt.Fprintln(cmd.OutOrStdout(), "The function library of this store's transitions is loaded.")
				}
			}
			return nil
		case storeurl.DynamoDB:
			if *status {
				return fmt.Errorf("%s: DynamoDB has no migrations to list: idem migrate creates the table", *st)
			}
			s, err := storeurl.Open(ctx, *st, nil) // creates the table and turns TTL on, or says what is wrong with it
			if err != nil {
				return err
			}
			defer s.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "The table %s is ready: partition key k (a string), TTL on the attribute ttl where the endpoint has TTL.\n", spec.Path)
			return nil
		default:
			fmt.Fprintf(cmd.OutOrStdout(), "%s has no schema to migrate\n", *st)
			return nil
		}
		if !*status {
			s, err := openStore(ctx, *st) // migrates the records
			if err != nil {
				return err
			}
			defer s.Close()
			logServerWarnings(ctx, s, migrateLogger(cmd))
			ob, closeFn, err := openOutbox(ctx, *st)
			if err != nil {
				return err
			}
			defer closeFn()
			if err := ob.Migrate(ctx); err != nil {
				return err
			}
		}
		applied, err := sqlmigrate.Status(ctx, conn, schema)
		if err != nil {
			return fmt.Errorf("migrate --status: %w", err)
		}
		w := cmd.OutOrStdout()
		if len(applied) == 0 {
			fmt.Fprintf(w, "%s: no migrations applied (run idem migrate)\n", *st)
		}
		for _, a := range applied {
			fmt.Fprintf(w, "%-8s %3d  %-22s applied %s\n", a.Component, a.Version, a.Name, a.AppliedAt.Format(time.RFC3339))
		}
		return nil
	}
	return cmd
}
