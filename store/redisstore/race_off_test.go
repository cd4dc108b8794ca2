//go:build !race

package redisstore_test

const raceDetector = false
