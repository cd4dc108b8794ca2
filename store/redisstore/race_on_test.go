//go:build race

package redisstore_test

// raceDetector: the test binary was built with -race.
const raceDetector = true
