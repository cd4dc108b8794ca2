package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

func newKeysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Inspect and remove idempotency records",
	}
	cmd.AddCommand(newKeysGetCmd(), newKeysLsCmd(), newKeysRmCmd(), newKeysPurgeCmd())
	return cmd
}

// keyArgs are the flags that turn a command-line id into a storage key.
type keyArgs struct {
	scope   string
	compact bool
}

func (k *keyArgs) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&k.scope, "scope", "", "the key's scope (consumer, route, tenant)")
	cmd.Flags().BoolVar(&k.compact, "compact", false, "the store holds compact (SHA-256/128) keys")
}

func (k *keyArgs) storage(id string) (string, error) {
	key := idem.Key{Scope: k.scope, ID: id}
	if err := key.Validate(); err != nil {
		return "", err
	}
	return key.Storage(k.compact), nil
}

type recordJSON struct {
	Key         string     `json:"key"`
	Scope       string     `json:"scope,omitempty"`
	ID          string     `json:"id,omitempty"`
	State       string     `json:"state"`
	Fence       uint64     `json:"fence"`
	Attempts    int        `json:"attempts"`
	Fingerprint string     `json:"fingerprint,omitempty"`
	LeaseUntil  *time.Time `json:"lease_until,omitempty"`
	ExpiresAt   time.Time  `json:"expires_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	ResultBytes int        `json:"result_bytes"`
	Result      string     `json:"result,omitempty"`
}

func toJSON(r store.Record) recordJSON {
	j := recordJSON{Key: store.DisplayKey(r.Key), State: r.State.String(), Fence: r.Fence, Attempts: r.Attempts,
		Fingerprint: r.Fingerprint, ExpiresAt: r.ExpiresAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(), ResultBytes: len(r.Result)}
	if scope, id, ok := store.SplitKey(r.Key); ok {
		j.Scope, j.ID = scope, id
	}
	if !r.LeaseUntil.IsZero() {
		t := r.LeaseUntil.UTC()
		j.LeaseUntil = &t
	}
	if utf8.Valid(r.Result) {
		j.Result = string(r.Result)
	}
	return j
}

func printRecords(w io.Writer, recs []store.Record, asJSON bool, header bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, r := range recs {
			if err := enc.Encode(toJSON(r)); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "KEY\tSTATE\tFENCE\tATTEMPTS\tLEASE LEFT\tEXPIRES\tRESULT")
	}
	now := time.Now()
	for _, r := range recs {
		lease := "-"
		if !r.LeaseUntil.IsZero() {
			if left := r.LeaseUntil.Sub(now); left > 0 {
				lease = left.Round(time.Millisecond).String()
			} else {
				lease = "expired"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", store.DisplayKey(r.Key), r.State, r.Fence, r.Attempts, lease,
			r.ExpiresAt.UTC().Format(time.RFC3339), preview(r.Result))
	}
	return tw.Flush()
}

func preview(b []byte) string {
	if len(b) == 0 {
		return "-"
	}
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes)", len(b))
	}
	s := strings.ReplaceAll(string(b), "\n", " ")
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return s
}

func newKeysGetCmd() *cobra.Command {
	var ka keyArgs
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show the record of one key",
		Args:  cobra.ExactArgs(1),
	}
	st := storeFlag(cmd)
	ka.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		key, err := ka.storage(args[0])
		if err != nil {
			return err
		}
		s, err := openStore(cmd.Context(), *st)
		if err != nil {
			return err
		}
		defer s.Close()
		rec, err := s.Get(cmd.Context(), key)
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%s: no record (never seen, deleted, or past retention)", store.DisplayKey(key))
		}
		if err != nil {
			return err
		}
		return printRecords(cmd.OutOrStdout(), []store.Record{rec}, asJSON, true)
	}
	return cmd
}

// walk calls page for every live record of s, once each: through Scan
// where the store has it (no order; a key met twice is skipped), else
// through List in key order.
func walk(ctx context.Context, s store.Store, batch int, page func([]store.Record) (more bool, err error)) error {
	if sc, ok := s.(store.Scanner); ok {
		seen := map[string]bool{}
		cursor := ""
		for {
			recs, next, err := sc.Scan(ctx, cursor, batch)
			if err != nil {
				return err
			}
			fresh := recs[:0]
			for _, r := range recs {
				if !seen[r.Key] {
					seen[r.Key] = true
					fresh = append(fresh, r)
				}
			}
			if more, err := page(fresh); err != nil || !more || next == "" {
				return err
			}
			cursor = next
		}
	}
	l, err := lister(s)
	if err != nil {
		return err
	}
	after := ""
	for {
		recs, err := l.List(ctx, after, batch)
		if err != nil || len(recs) == 0 {
			return err
		}
		after = recs[len(recs)-1].Key
		if more, err := page(recs); err != nil || !more {
			return err
		}
	}
}

func lister(s store.Store) (store.Lister, error) {
	l, ok := s.(store.Lister)
	if !ok {
		return nil, errors.New("this store cannot list its records")
	}
	return l, nil
}

func newKeysLsCmd() *cobra.Command {
	var asJSON bool
	var state string
	var limit int
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List records in key order",
		Args:  cobra.NoArgs,
	}
	st := storeFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")
	cmd.Flags().StringVar(&state, "state", "", "only records in this state (in-flight, completed, failed, poisoned, released)")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many records (0: all)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		var want store.State
		if state != "" {
			var err error
			if want, err = store.ParseState(state); err != nil {
				return err
			}
		}
		s, err := openStore(cmd.Context(), *st)
		if err != nil {
			return err
		}
		defer s.Close()
		shown, header := 0, true
		err = walk(cmd.Context(), s, 500, func(page []store.Record) (bool, error) {
			keep := page[:0]
			for _, r := range page {
				if (want == 0 || r.State == want) && (limit == 0 || shown < limit) {
					keep = append(keep, r)
					shown++
				}
			}
			if err := printRecords(cmd.OutOrStdout(), keep, asJSON, header); err != nil {
				return false, err
			}
			header = false
			return limit == 0 || shown < limit, nil
		})
		if err != nil {
			return err
		}
		if shown == 0 && !asJSON {
			fmt.Fprintln(cmd.ErrOrStderr(), "no records")
		}
		return nil
	}
	return cmd
}

func newKeysRmCmd() *cobra.Command {
	var ka keyArgs
	cmd := &cobra.Command{
		Use:   "rm ID...",
		Short: "Forget keys, whatever their state (the next delivery runs the work again)",
		Args:  cobra.MinimumNArgs(1),
	}
	st := storeFlag(cmd)
	ka.register(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		keys := make([]string, len(args))
		for i, a := range args {
			k, err := ka.storage(a)
			if err != nil {
				return err
			}
			keys[i] = k
		}
		s, err := openStore(cmd.Context(), *st)
		if err != nil {
			return err
		}
		defer s.Close()
		for _, k := range keys {
			if err := s.Delete(cmd.Context(), k); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", store.DisplayKey(k))
		}
		return nil
	}
	return cmd
}

func newKeysPurgeCmd() *cobra.Command {
	var expired, all, quiet bool
	cmd := &cobra.Command{
		Use:   "purge --expired | --all",
		Short: "Delete expired records (--expired) or every record (--all), in batches",
		Args:  cobra.NoArgs,
	}
	st := storeFlag(cmd)
	cmd.Flags().BoolVar(&expired, "expired", false, "delete records past their retention (never a live lease)")
	cmd.Flags().BoolVar(&all, "all", false, "delete every record, live leases included")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress bar")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if expired == all {
			return errors.New("say which records to purge: --expired or --all")
		}
		s, err := openStore(cmd.Context(), *st)
		if err != nil {
			return err
		}
		defer s.Close()
		bar := progressbar.NewOptions64(-1,
			progressbar.OptionSetWriter(cmd.ErrOrStderr()),
			progressbar.OptionSetDescription("purging"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("records"),
			progressbar.OptionSetVisibility(!quiet),
			progressbar.OptionClearOnFinish(),
		)
		total := 0
		const batch = 1000
		if all {
			err := walk(cmd.Context(), s, batch, func(page []store.Record) (bool, error) {
				for _, r := range page {
					if err := s.Delete(cmd.Context(), r.Key); err != nil {
						return false, err
					}
				}
				total += len(page)
				_ = bar.Add(len(page))
				return true, nil
			})
			if err != nil {
				return err
			}
		}
		// Records past retention (with --all, the ones List does not show).
		for {
			n, err := s.Sweep(cmd.Context(), batch)
			if err != nil {
				return err
			}
			total += n
			_ = bar.Add(n)
			if n < batch {
				break
			}
		}
		_ = bar.Finish()
		fmt.Fprintf(cmd.OutOrStdout(), "purged %d records\n", total)
		return nil
	}
	return cmd
}
