//go:build race

package console_test

// raceDetector: the test binary was built with -race.
const raceDetector = true
