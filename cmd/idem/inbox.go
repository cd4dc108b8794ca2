package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// inboxTable is what the inbox commands and the console do with an inbox
// of any driver.
type inboxTable interface {
	List(ctx context.Context, consumer, afterConsumer, afterID string, limit int) ([]inbox.Row, error)
	Find(ctx context.Context, correlationID string) ([]inbox.Row, error)
	Sweep(ctx context.Context, olderThan time.Duration, limit int) (int, error)
}

// openInbox opens the inbox table (processed_events, or --table) of a
// sqlite:, postgres:// or mysql:// store URL.
func openInbox(ctx context.Context, raw, table string) (inboxTable, func(), error) {
	d, err := openSQLDB(ctx, raw, "inbox")
	if err != nil {
		return nil, nil, err
	}
	if table == "" {
		table = "processed_events"
		if d.schema != "" {
			table = d.schema + "." + table
		}
	}
	var ib inboxTable
	if d.db != nil {
		ib, err = inbox.New[*sql.Tx](databasesql.New(d.db, d.dialect()), inbox.Config{Table: table})
	} else {
		ib, err = inbox.New[pgx.Tx](pgxv5.New(d.pool, d.pgOpts...), inbox.Config{Table: table})
	}
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return ib, d.Close, nil
}

func newInboxCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "inbox", Short: "List and sweep the transactional inbox's processed keys"}
	cmd.AddCommand(newInboxLsCmd(), newInboxSweepCmd())
	return cmd
}

func newInboxLsCmd() *cobra.Command {
	var consumer, table string
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List processed keys in key order",
		Args:  cobra.NoArgs,
	}
	store := storeFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&consumer, "consumer", "", "only this consumer's keys")
	f.StringVar(&table, "table", "", "the inbox table (default processed_events, in idem_schema when the URL sets it)")
	f.IntVar(&limit, "limit", 0, "at most this many keys (0: all)")
	f.BoolVar(&asJSON, "json", false, "one JSON object per line")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ib, closeFn, err := openInbox(cmd.Context(), *store, table)
		if err != nil {
			return err
		}
		defer closeFn()
		out := cmd.OutOrStdout()
		tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
		if !asJSON {
			fmt.Fprintln(tw, "CONSUMER\tCORRELATION ID\tTYPE\tPROCESSED AT\tVERSION")
		}
		shown, afterC, afterID := 0, "", ""
		for limit == 0 || shown < limit {
			page := 500
			if limit > 0 {
				page = min(page, limit-shown)
			}
			rows, err := ib.List(cmd.Context(), consumer, afterC, afterID, page)
			if err != nil {
				return err
			}
			if err := printInboxRows(out, tw, rows, asJSON); err != nil {
				return err
			}
			shown += len(rows)
			if len(rows) < page {
				break
			}
			afterC, afterID = rows[len(rows)-1].Consumer, rows[len(rows)-1].CorrelationID
		}
		if !asJSON {
			tw.Flush()
		}
		if shown == 0 && !asJSON {
			fmt.Fprintln(cmd.ErrOrStderr(), "no processed keys")
		}
		return nil
	}
	return cmd
}

func printInboxRows(out io.Writer, tw *tabwriter.Writer, rows []inbox.Row, asJSON bool) error {
	for _, r := range rows {
		if asJSON {
			b, err := json.Marshal(map[string]any{"consumer": r.Consumer, "correlation_id": r.CorrelationID, "type": r.Type,
				"processed_at": r.ProcessedAt.UTC(), "consumer_version": r.ConsumerVersion})
			if err != nil {
				return err
			}
			fmt.Fprintln(out, string(b))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", printable(r.Consumer), printable(r.CorrelationID), printable(r.Type),
			r.ProcessedAt.UTC().Format(time.RFC3339), printable(r.ConsumerVersion))
	}
	return nil
}

func newInboxSweepCmd() *cobra.Command {
	var table string
	var olderThan time.Duration
	var batch int
	cmd := &cobra.Command{
		Use:   "sweep --older-than DURATION",
		Short: "Delete keys processed longer ago than DURATION (keep them longer than the broker can redeliver)",
		Args:  cobra.NoArgs,
	}
	store := storeFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&table, "table", "", "the inbox table (default processed_events, in idem_schema when the URL sets it)")
	f.DurationVar(&olderThan, "older-than", 0, "age of the keys to delete (required)")
	f.IntVar(&batch, "batch", 1000, "keys deleted per statement")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if olderThan <= 0 {
			return errors.New("--older-than is required: a duplicate that arrives after its key was swept runs again")
		}
		ib, closeFn, err := openInbox(cmd.Context(), *store, table)
		if err != nil {
			return err
		}
		defer closeFn()
		total := 0
		for {
			n, err := ib.Sweep(cmd.Context(), olderThan, batch)
			if err != nil {
				return err
			}
			total += n
			if n < batch {
				break
			}
		}
		fmt.Fprintf(cmd.OutOrStdout(), "swept %d keys processed more than %v ago\n", total, olderThan)
		return nil
	}
	return cmd
}

// printable renders text from the database for a table: "-" when empty,
// quoted (Go syntax) when it holds control characters or is not UTF-8, so
// a hostile id cannot break the columns or the terminal.
func printable(s string) string {
	if s == "" {
		return "-"
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return strconv.Quote(s)
		}
	}
	return s
}
