//go:build !unix

package cputime

import "time"

// Process reports that this platform's CPU time is not read here (false).
func Process() (time.Duration, bool) { return 0, false }
