//go:build race

package coalesce

// raceDetector: the test binary was built with -race.
const raceDetector = true
