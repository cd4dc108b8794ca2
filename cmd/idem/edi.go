package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem/edi"
)

func newEDICmd() *cobra.Command {
	cmd := &cobra.Command{Use: "edi", Short: "Inspect EDIFACT and X12 interchanges"}
	cmd.AddCommand(newEDIInspectCmd())
	return cmd
}

type interchangeJSON struct {
	File              string   `json:"file"`
	Offset            int64    `json:"offset"`
	Standard          string   `json:"standard"`
	Sender            string   `json:"sender"`
	SenderQualifier   string   `json:"sender_qualifier"`
	Receiver          string   `json:"receiver"`
	ReceiverQualifier string   `json:"receiver_qualifier"`
	Control           string   `json:"control"`
	Key               string   `json:"key"`
	Groups            int      `json:"groups"`
	Messages          int      `json:"messages"`
	Test              bool     `json:"test"`
	Valid             bool     `json:"valid"`
	Errors            []string `json:"errors"`
}

func newEDIInspectCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect [--json] FILE...",
		Short: "Summarise and validate every interchange of the files",
		Long: `Prints, for each interchange, its standard, parties, control reference, dedup key,
groups, messages and every envelope problem found. Exit status: 0 when every interchange
is valid, 1 when one is invalid, 2 when a file cannot be read as EDI at all.`,
		Args: cobra.MinimumNArgs(1),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per interchange, one per line")
	cmd.RunE = func(cmd *cobra.Command, files []string) error {
		out := cmd.OutOrStdout()
		enc := json.NewEncoder(out)
		status := 0
		for _, f := range files {
			fh, err := os.Open(f)
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "idem: %s: %v\n", f, err)
				status = 2
				continue
			}
			r := edi.NewReader(fh)
			for {
				ic, err := r.Next()
				if err != nil {
					if !errors.Is(err, io.EOF) {
						fmt.Fprintf(cmd.ErrOrStderr(), "idem: %s: %v\n", f, err)
						status = 2
					}
					break
				}
				j := interchangeJSON{File: f, Offset: ic.Offset, Standard: string(ic.Standard), Sender: ic.Sender, SenderQualifier: ic.SenderQualifier,
					Receiver: ic.Receiver, ReceiverQualifier: ic.ReceiverQualifier, Control: ic.Control, Key: ic.Key(),
					Groups: len(ic.Groups), Messages: ic.MessageCount(), Test: ic.Test, Valid: ic.Valid(), Errors: []string{}}
				for _, e := range ic.Errors {
					j.Errors = append(j.Errors, e.Error())
				}
				if !ic.Valid() && status == 0 {
					status = 1
				}
				if asJSON {
					if err := enc.Encode(j); err != nil {
						return err
					}
					continue
				}
				mark := "valid"
				if !j.Valid {
					mark = fmt.Sprintf("INVALID (%d problems)", len(j.Errors))
				}
				fmt.Fprintf(out, "%s @%d: %s %s → %s, control %s, %d groups, %d messages%s — %s\n  key %s\n",
					f, j.Offset, j.Standard, party(j.Sender, j.SenderQualifier), party(j.Receiver, j.ReceiverQualifier), j.Control,
					j.Groups, j.Messages, map[bool]string{true: " (test)"}[j.Test], mark, j.Key)
				for _, e := range j.Errors {
					fmt.Fprintf(out, "  - %s\n", e)
				}
			}
			fh.Close()
		}
		if status != 0 {
			return exitCode(status)
		}
		return nil
	}
	return cmd
}

func party(id, qual string) string {
	if qual == "" {
		return id
	}
	return id + " (" + qual + ")"
}
