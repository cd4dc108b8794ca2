// Package proccpu reads, from /proc, the CPU time this process and the
// local servers the benchmarks run against have used: to report CPU per
// message beside a rate.
package proccpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Seconds returns the CPU time (user + system) used so far by this
// process and by every local process named nats-server, redis-server,
// postgres (the server and its backends) or node (fauxqs, the SQS
// emulator),
// read from /proc (Linux; nil elsewhere).
func Seconds() map[string]float64 {
	out := map[string]float64{}
	self := strconv.Itoa(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		comm, err := os.ReadFile(dir + "/comm")
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		if filepath.Base(dir) == self {
			name = "self"
		} else if name != "nats-server" && name != "redis-server" && name != "postgres" && name != "node" {
			continue
		}
		stat, err := os.ReadFile(dir + "/stat")
		if err != nil {
			continue
		}
		// Fields after the ")" that ends the command name: utime is the
		// 12th, stime the 13th (fields 14 and 15 of proc(5)).
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		out[name] += (ut + st) / 100 // clock ticks (USER_HZ = 100)
	}
	return out
}

// PerMessage formats the CPU each process spent per message between two
// Seconds readings.
func PerMessage(before, after map[string]float64, messages float64) string {
	var parts []string
	total := 0.0
	for _, name := range []string{"self", "nats-server", "redis-server", "postgres", "node"} {
		d := after[name] - before[name]
		if d <= 0 {
			continue
		}
		total += d
		parts = append(parts, fmt.Sprintf("%s %.0f µs", name, d/messages*1e6))
	}
	return fmt.Sprintf("CPU per message: %s; total %.0f µs", strings.Join(parts, ", "), total/messages*1e6)
}
