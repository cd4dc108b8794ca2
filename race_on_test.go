//go:build race

package idem_test

// raceDetector: the test binary was built with -race.
const raceDetector = true
