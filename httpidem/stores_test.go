package httpidem_test

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/sqlitestore"
)

// TestEveryStore runs the replay and a 50-request storm on every backend.
func TestEveryStore(t *testing.T) {
	stores := map[string]func(t *testing.T) store.Store{
		"sqlite": func(t *testing.T) store.Store {
			s, err := sqlitestore.Open(t.Context(), sqlitestore.Config{Path: filepath.Join(t.TempDir(), "h.db")})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"postgres": func(t *testing.T) store.Store {
			return testenv.OpenPostgres(t, testenv.RandomName("idemtest_"), pgstore.Config{})
		},
		"redis": func(t *testing.T) store.Store { return testenv.OpenRedis(t, testenv.RandomName("idemtest:")+":") },
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			a := &app{}
			srv := serve(t, a, httpidem.Config{Store: open(t)})
			var wg sync.WaitGroup
			for range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if r := do(t, srv, "POST", `"storm"`, "", "x"); r.status != 201 && r.status != 409 {
						t.Errorf("status %d", r.status)
					}
				}()
			}
			wg.Wait()
			r := do(t, srv, "POST", `"storm"`, "", "x")
			if r.status != 201 || r.header.Get(httpidem.ReplayedHeader) != "true" || a.runs.Load() != 1 {
				t.Fatalf("after the storm: %+v, runs %d", r, a.runs.Load())
			}
		})
	}
}
