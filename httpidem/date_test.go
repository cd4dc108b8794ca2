package httpidem

import (
	"math/rand/v2"
	"net/http"
	"testing"
	"time"
)

// TestHTTPDate: appendHTTPDate writes what time.Format(http.TimeFormat)
// writes, for any time of any zone.
func TestHTTPDate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	zone := time.FixedZone("X", -7*3600)
	for i := range 100_000 {
		at := time.Unix(rng.Int64N(1<<36)-1<<35, rng.Int64N(1e9))
		if i%2 == 0 {
			at = at.In(zone)
		}
		if got, want := string(appendHTTPDate(nil, at)), at.UTC().Format(http.TimeFormat); got != want {
			t.Fatalf("%v: %q, want %q", at, got, want)
		}
	}
}
