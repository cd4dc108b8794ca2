package httpidem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/store/memstore"
)

// benchmarkMiddleware serves b.N requests through the middleware on a
// memory store, without a network: each with a new key (execute) or all
// with one key answered before (replay).
func benchmarkMiddleware(b *testing.B, replay bool) {
	s := memstore.New(memstore.Config{})
	b.Cleanup(func() { s.Close() })
	mw, err := httpidem.New(httpidem.Config{Store: s})
	if err != nil {
		b.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"pay_1","amount":10}`))
	}))
	// A server's request context can be cancelled (the client leaves).
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	// The caller's credentials: without them a request is not replayed
	// (DefaultPrincipal), and the handler runs.
	send := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/payments", strings.NewReader("amount=10"))
		req.Header.Set(httpidem.HeaderName, key)
		req.Header.Set("Authorization", "Bearer bench")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if replay {
		send(`"k"`)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		key := `"k"`
		if !replay {
			key = `"` + strconv.Itoa(i) + `"`
		}
		rec := send(key)
		if rec.Code != http.StatusCreated || (rec.Header().Get(httpidem.ReplayedHeader) == "true") != replay {
			b.Fatalf("status %d, replayed %q", rec.Code, rec.Header().Get(httpidem.ReplayedHeader))
		}
	}
}

func BenchmarkExecute(b *testing.B) { benchmarkMiddleware(b, false) }
func BenchmarkReplay(b *testing.B)  { benchmarkMiddleware(b, true) }
