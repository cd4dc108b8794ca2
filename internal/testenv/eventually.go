package testenv

import (
	"testing"
	"time"
)

// Eventually polls cond every 20 ms until it returns nil, failing t with
// what and cond's last error after timeout. For state kept by another
// process (a server starting, a cluster converging), which no signal
// reports to the test.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
