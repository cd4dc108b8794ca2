package fleet

import (
	"flag"
	"testing"
	"time"
)

// ShortDuration is how long a campaign runs under go test -short.
const ShortDuration = 2 * time.Second

// Duration is how long a campaign runs: d, the value of its duration flag
// (named name), or under -short — where the flag was not given — at most
// ShortDuration, so that go test -short ./... stays quick; the long modes
// are .ci/run's.
func Duration(name string, d time.Duration) time.Duration {
	if !testing.Short() {
		return d
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	if given {
		return d
	}
	return min(d, ShortDuration)
}
