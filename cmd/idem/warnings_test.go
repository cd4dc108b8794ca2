package main

import (
	"bytes"
	"context"
	"errors"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// settingsStore is a store whose server has settings to warn about (as
// redisstore.Store reports them), for the logging of idem serve.
type settingsStore struct {
	store.Store
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
		store store.Store
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

// TestServeExportsServerWarnings: idem serve's /metrics says how many of
// the store server's settings are unsafe, read at each scrape
// (idem_store_server_warnings): a setting changed while the gateway runs —
// Redis's append-only file turned off — shows at the next scrape, where
// the log at start no longer can.
func TestServeExportsServerWarnings(t *testing.T) {
	srv := testenv.StartRedisServer(t, "--appendonly", "yes", "--appendfsync", "always")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	defer up.Close()
	g := startGateway(t, "--upstream", up.URL, "--store", "redis://"+srv.Addr+"/0")
	if m := g.metrics(t); !strings.Contains(m, "\nidem_store_server_warnings 0\n") {
		t.Fatalf("metrics on a Redis set as idem recommends lack idem_store_server_warnings 0:\n%s", m)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	if err := c.ConfigSet(context.Background(), "appendonly", "no").Err(); err != nil {
		t.Fatal(err)
	}
	if m := g.metrics(t); !strings.Contains(m, "\nidem_store_server_warnings 1\n") {
		t.Fatalf("metrics after appendonly no lack idem_store_server_warnings 1:\n%s", m)
	}
}
