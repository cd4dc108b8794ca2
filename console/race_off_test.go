//go:build !race

package console_test

const raceDetector = false
