package testenv

import (
	"os"
	"testing"
)

// Required reports whether unreachable services fail tests.
func Required() bool { return os.Getenv("IDEM_TEST_REQUIRE") == "1" }

// URL returns the value of the environment variable env, or def.
func URL(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// Need skips or fails t when err (the result of probing service at addr) is
// not nil.
func Need(t testing.TB, service, addr string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if Required() {
		t.Fatalf("%s at %s is unreachable and IDEM_TEST_REQUIRE=1: %v", service, addr, err)
	}
	t.Skipf("%s at %s is unreachable (%v); start it or set its URL — with IDEM_TEST_REQUIRE=1 this fails", service, addr, err)
}

// skipShort skips t under go test -short: it starts servers of its own —
// seconds each, to crash, fail over or reconfigure them — which .ci/run's
// full run covers.
func skipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: this test starts %s of its own (bash .ci/run runs it)", what)
	}
}

// SkipShort skips t under go test -short: it starts what (a server, an
// emulator) of its own, which .ci/run's full run covers.
func SkipShort(t testing.TB, what string) {
	t.Helper()
	skipShort(t, what)
}

// FreePort returns a loopback port that was free when chosen.
func FreePort(t testing.TB) int {
	t.Helper()
	return freePort(t)
}
