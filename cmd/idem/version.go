package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of idem and the revision it was built from",
		Long: `Print the module version (v0.1.0 for a release installed with go install …@v0.1.0,
"(devel)" for a build from a checkout), the VCS revision and time it was built from
(with "modified" when the checkout had uncommitted changes), and the Go version.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, ok := debug.ReadBuildInfo()
			if !ok {
				return fmt.Errorf("this binary carries no build information")
			}
			fmt.Fprintln(cmd.OutOrStdout(), versionLine(info))
			return nil
		},
	}
}

// versionLine is what idem version prints of info.
func versionLine(info *debug.BuildInfo) string {
	line := "idem " + info.Main.Version
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		line += ", revision " + rev
		if t := settings["vcs.time"]; t != "" {
			line += " of " + t
		}
		if settings["vcs.modified"] == "true" {
			line += ", modified"
		}
	}
	return line + ", " + info.GoVersion
}
