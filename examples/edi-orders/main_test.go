package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

func TestEveryOrderBookedOnce(t *testing.T) {
	var out bytes.Buffer
	ok, err := run(context.Background(), &out, filepath.Join(t.TempDir(), "app.db"), 4)
	if err != nil || !ok {
		t.Fatalf("ok=%v err=%v\n%s", ok, err, out.String())
	}
	if !strings.Contains(out.String(), "attempt 2: acked") {
		t.Fatalf("no retry happened:\n%s", out.String())
	}
	t.Log("\n" + out.String())
}
