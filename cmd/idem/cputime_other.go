//go:build !unix

package main

import "time"

// processCPU reports that this platform's CPU time is not read here: the
// bench then leaves client_cpu_us_per_op out.
func processCPU() (time.Duration, bool) { return 0, false }
