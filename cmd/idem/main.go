package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/sqlmigrate"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
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
	root.AddCommand(newDemoCmd(), newServeCmd(), newKeysCmd(), newOutboxCmd(), newRelayCmd(), newEDICmd(), newAS2Cmd(), newInboxCmd(), newConsoleCmd(), newMigrateCmd(), newBenchCmd())
	return root
}

// storeFlag adds --store to cmd and returns where its value lands.
func storeFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("store", storeurl.Default, "store URL: memory:, sqlite:PATH, postgres://… or redis://…")
}

func openStore(ctx context.Context, url string) (idem.Store, error) {
	return storeurl.Open(ctx, url, nil)
}

// redisEncodingNote is what an upgrade changes on Redis.
const redisEncodingNote = `Since this release a Redis record is one packed string, no longer a hash
of named fields: records written in the first encoding are read as they are and rewritten packed
by their next transition, so nothing needs migrating; but a process of the first release fails
closed (WRONGTYPE) on a packed record, so upgrade every process that shares a key prefix together.
Buckets (idem_buckets=N in the store URL, redisstore.Config.Buckets) keep many records per hash:
once every process of a prefix runs this release, turn them on in all of them at once; records
written before are read where they are and moved into their bucket by their next transition. A
process without buckets does not see bucketed records, so there is no way back, and N must not
change afterwards (like the prefix, it says where a record is). Records with results longer than
28 bytes need the server's hash-max-listpack-value raised to 128 for the compact layout.
This release names buckets anew and packs their values 3 bytes shorter (format 3): a bucket of the
previous release is read where it is, and this release's first write into it moves its records
and leaves under its old name a marker on which a process of the previous release fails closed
(WRONGTYPE). To upgrade from the previous release with buckets one process at a time, do it in
two steps: first deploy this release with idem_buckets_previous=1 in the store URL
(redisstore.Config.WritePreviousBuckets) — it then writes into the previous release's buckets as
that release does, so processes of both work side by side and every claim settles — and, once no
process of the previous release is left, deploy it without: the next write into each bucket moves
it. A marker is a key of ~170–210 bytes a bucket (3.4 bytes a record at ~61 records a bucket); once no
process of the previous release will run on the prefix again, a rollback included, a third step
may drop them: idem_buckets_previous=retired (redisstore.Config.PreviousReleaseRetired) leaves
none, and deletes those left earlier as each bucket next extends its TTL.
This release calls its transitions as Redis functions (FCALL) where earlier releases sent scripts
(EVALSHA): a library named idem_ and a digest of its source, loaded by idem migrate on every master
(FUNCTION LOAD) and by each process on a server where a call finds it missing. A user the ACL denies
FCALL or FUNCTION gets the scripts as before; redisstore.Config.NoFunctions sends only scripts. The
libraries of earlier releases may be deleted (FUNCTION DELETE) once no process of them runs: one
that still does loads its own again.`

// pgLayoutNote is what the packed layout of the PostgreSQL records table
// changes.
const pgLayoutNote = `Since this release a PostgreSQL records table is created with keys and
fingerprints packed as bytea (a compact key as its 16 bytes, a request digest as 17) and its
columns ordered without padding: a completed record with a compact key takes 160 bytes of row and
key index entry instead of 202. A table created by an earlier release keeps the text layout, and
the store reads which layout a table has and works on either, so an upgrade needs no migration
and processes of both releases share such a table. To pack such a table, stop the processes of
earlier releases and run idem migrate --pack-records: it converts the table in place, locked while
PostgreSQL rewrites it (every call waits); a process of this release that read the text layout
before fails its first call on the packed table closed and reads the layout again. A process of an
earlier release fails closed on a table of the packed layout (its statements are refused).`

// migrateLogger writes idem migrate's warnings to the command's standard
// error.
func migrateLogger(cmd *cobra.Command) *log.Logger {
	return log.New(cmd.ErrOrStderr(), "idem migrate: ", 0)
}

func newMigrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate [--status]",
		Short: "Create or upgrade the store's schema (records and outbox) and print its versions",
		Long: `Applies the missing numbered migrations of the idempotency records and of the outbox, each
in one transaction under the migration lock (an advisory lock on PostgreSQL, BEGIN IMMEDIATE on
SQLite), and prints the versions recorded in idem_migrations. Any number of processes may run it
at once. Every other command that opens a SQL store migrates it the same way at start, so
containers that start together all succeed; --status only prints.

` + pgLayoutNote + `

Redis has no schema. ` + redisEncodingNote + `

It also reads the server's settings and warns, on standard error, of those under which a crash
loses acknowledged records (the store's ServerWarnings: a Redis without an append-only file,
a PostgreSQL with fsync off, …).`,
		Args: cobra.NoArgs,
	}
	store := storeFlag(cmd)
	status := cmd.Flags().Bool("status", false, "print the applied versions without migrating")
	pack := cmd.Flags().Bool("pack-records", false, "PostgreSQL: convert a records table of the text layout to the packed one in place (locks the table while it is rewritten; stop processes of earlier releases first)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		spec, err := storeurl.Parse(*store)
		if err != nil {
			return err
		}
		var conn sqlmigrate.Conn
		var schema string
		var pg *pgstore.Store
		switch spec.Kind {
		case storeurl.SQLite:
			db, err := sqlitestore.OpenDB(ctx, spec.Path, sqlitestore.DBOptions{Synchronous: spec.Query.Get("synchronous"), BusyTimeout: 10 * time.Second})
			if err != nil {
				return err
			}
			defer db.Close()
			conn = databasesql.New(db, sqldriver.SQLite)
		case storeurl.Postgres:
			s, err := storeurl.Open(ctx, *store, &storeurl.Options{SkipMigrate: true})
			if err != nil {
				return err
			}
			defer s.Close()
			pg = s.(*pgstore.Store)
			conn, schema = pgxv5.New(pg.Pool()), pg.Schema()
		case storeurl.Redis:
			fmt.Fprintf(cmd.OutOrStdout(), "%s has no schema to migrate. %s\n", *store, redisEncodingNote)
			s, err := openStore(ctx, *store)
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
		default:
			fmt.Fprintf(cmd.OutOrStdout(), "%s has no schema to migrate\n", *store)
			return nil
		}
		if !*status {
			s, err := openStore(ctx, *store) // migrates the records
			if err != nil {
				return err
			}
			defer s.Close()
			logServerWarnings(ctx, s, migrateLogger(cmd))
			ob, closeFn, err := openOutbox(ctx, *store)
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
			fmt.Fprintf(w, "%s: no migrations applied (run idem migrate)\n", *store)
		}
		for _, a := range applied {
			fmt.Fprintf(w, "%-8s %3d  %-22s applied %s\n", a.Component, a.Version, a.Name, a.AppliedAt.Format(time.RFC3339))
		}
		if *pack && pg == nil {
			return errors.New("idem migrate: --pack-records is for a PostgreSQL store")
		}
		if *pack && !*status {
			converted, err := pg.PackRecords(ctx)
			if err != nil {
				return err
			}
			if converted {
				fmt.Fprintln(w, "records: converted from the text layout to the packed layout")
			}
		}
		if pg != nil && len(applied) > 0 {
			packed, err := pg.PackedLayout(ctx)
			if err != nil {
				return err
			}
			if packed {
				fmt.Fprintln(w, "records: packed layout (keys and fingerprints as bytea)")
			} else {
				fmt.Fprintln(w, "records: text layout (keys and fingerprints as text: a table created by a release before the packed layout, kept as it is; --pack-records converts it)")
			}
		}
		return nil
	}
	return cmd
}
