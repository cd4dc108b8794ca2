package as2

import (
	"bytes"
	"strings"
	"testing"
)

// TestMultipartOfManyEmptyPartsIsRefusedEarly: a multipart/signed body of
// a million empty parts is refused at the third, collecting two at most —
// not a slice of a million part headers beside the body.
func TestMultipartOfManyEmptyPartsIsRefusedEarly(t *testing.T) {
	body := append([]byte("--b\n"), bytes.Repeat([]byte("\n--b\n"), 1_000_000)...)
	body = append(body, "--b--\n"...)
	allocs := testing.AllocsPerRun(3, func() {
		parts, err := splitMultipart(body, "b", 2)
		if err == nil || !strings.Contains(err.Error(), "more than 2 parts") || parts != nil {
			t.Fatalf("%d parts, %v; want refused past two", len(parts), err)
		}
	})
	if allocs > 10 {
		t.Fatalf("%v allocations to refuse it", allocs)
	}
	// Two parts are read as before.
	parts, err := splitMultipart([]byte("--b\r\nA\r\n--b\r\nB\r\n--b--\r\n"), "b", 2)
	if err != nil || len(parts) != 2 || string(parts[0]) != "A" || string(parts[1]) != "B" {
		t.Fatalf("two parts: %q %v", parts, err)
	}
}
