//go:build race

package race

// Enabled: the binary was built with -race.
const Enabled = true
