//go:build !race

// Package race says whether the binary was built with the race detector,
// for tests whose measurements it would distort or slow past use.
package race

// Enabled: the binary was built with -race.
const Enabled = false
