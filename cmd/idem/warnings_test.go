package main

import (
	"bytes"
	"context"
	"errors"
	"log"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/memstore"
)

// settingsStore is a store whose server has settings to warn about (as
// redisstore.Store reports them), for the logging of idem serve.
type settingsStore struct {
	idem.Store
	warnings []string
	err      error
}

func (s settingsStore) ServerWarnings(context.Context) ([]string, error) { return s.warnings, s.err }

// TestServeLogsServerWarnings: idem serve logs each warning a store gives
// about its server's settings (redisstore.Store.ServerWarnings, tested
// against Redis there), says so when it cannot read them, and logs nothing
// for a store without such settings.
func TestServeLogsServerWarnings(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(memstore.Config{})
	for _, tc := range []struct {
		store idem.Store
		want  []string
	}{
		{mem, nil},
		{settingsStore{Store: mem}, nil},
		{settingsStore{Store: mem, warnings: []string{"a: maxmemory-policy is allkeys-lru", "b: hash-max-listpack-value is 64"}},
			[]string{"warning: a: maxmemory-policy is allkeys-lru", "warning: b: hash-max-listpack-value is 64"}},
		{settingsStore{Store: mem, err: errors.New("NOPERM")}, []string{"cannot read the store server's settings (NOPERM)"}},
	} {
		var out bytes.Buffer
		logServerWarnings(ctx, tc.store, log.New(&out, "", 0))
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if out.Len() == 0 {
			lines = nil
		}
		if len(lines) != len(tc.want) {
			t.Fatalf("logged %q, want %q", lines, tc.want)
		}
		for i, w := range tc.want {
			if !strings.Contains(lines[i], w) {
				t.Fatalf("logged %q, want %q", lines, tc.want)
			}
		}
	}
}
