// Package cputime reads the CPU time this process has used, for
// benchmarks that report CPU per operation (all threads: the garbage
// collector's work included) beside wall time.
package cputime
