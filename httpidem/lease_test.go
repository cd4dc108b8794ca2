package httpidem_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/storetest"
)

// TestHandlerStopsWhenItsLeaseRunsOut: the store becomes unreachable while
// the handler runs, so its heartbeats fail. The handler's context must be
// cancelled, with cause idem.ErrLeaseExpired, before another gateway or
// process can take the key over — whether the client still waits or has
// gone (FinishTimeout lets the handler outlive its client, never its lease).
// The gateway campaign found it: a slow upstream call went on past its
// lease while another gateway ran the same request.
func TestHandlerStopsWhenItsLeaseRunsOut(t *testing.T) {
	for _, clientLeaves := range []bool{false, true} {
		name := "ClientWaits"
		if clientLeaves {
			name = "ClientLeft"
		}
		t.Run(name, func(t *testing.T) {
			proxy := testenv.RedisProxy(t)
			prefix := testenv.RandomName("idemtest:") + ":"
			s, direct := testenv.OpenRedisAt(t, proxy.Addr(), prefix), testenv.OpenRedis(t, prefix)
			const lease = 2 * time.Second
			beats := make(chan error, 100)
			g, err := idem.NewGuard(idem.Config{Store: s, Lease: lease, HeartbeatInterval: lease / 4, Observer: func(e idem.Event) {
				if e.Phase == "heartbeat" {
					select {
					case beats <- e.Err:
					default:
					}
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			entered, ended, release := make(chan context.Context, 1), make(chan struct{}), make(chan struct{})
			srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(ended)
				entered <- r.Context()
				select {
				case <-r.Context().Done():
					w.WriteHeader(http.StatusServiceUnavailable)
				case <-release:
					w.WriteHeader(http.StatusCreated)
				}
			}), httpidem.Config{Guard: g, FinishTimeout: time.Minute})

			ctx, leave := context.WithCancel(context.Background())
			defer leave()
			defer func() { close(release); <-ended }()
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/payments", strings.NewReader("pay 10"))
			req.Header.Set("Idempotency-Key", `"slow"`)
			go func() {
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			handler := <-entered
			if clientLeaves {
				for len(beats) > 0 {
					<-beats
				}
				leave()
				for err := range beats { // the lease is kept after the client left
					if err == nil {
						break
					}
				}
				if handler.Err() != nil {
					t.Fatalf("the handler was cancelled when its client left: %v", context.Cause(handler))
				}
			}
			proxy.Cut()
			defer proxy.Restore()
			key := g.StorageKey(idem.Key{Scope: "POST /payments anonymous", ID: "slow"})
			storetest.TakeOverAfterTheLease(t, direct, store.AcquireRequest{Key: key, Lease: time.Minute, Retention: time.Hour,
				Fingerprint: idem.Fingerprint([]byte("POST"), []byte("/payments"), []byte("pay 10"))}, handler, lease)
		})
	}
}
