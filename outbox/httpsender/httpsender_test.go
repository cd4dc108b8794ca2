package httpsender_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/internal/keyheader"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/httpsender"
	"github.com/idemgo/idem/outbox/sendertest"
	"github.com/idemgo/idem/store/memstore"
)

// TestConformance: the receiver is an Idempotency-Key server (httpidem over
// a memory store) in front of a handler that records what it got; a retry
// of a delivered key is answered by the replay.
func TestConformance(t *testing.T) {
	sendertest.Run(t, sendertest.Target{
		Sender:   httpsender.New(httpsender.Config{Timeout: 5 * time.Second}),
		Features: sendertest.Features{DuplicateAnswer: true, ReceiverDedups: true},
		Destination: func(t *testing.T) (string, func() []sendertest.Delivery) {
			var mu sync.Mutex
			var got []sendertest.Delivery
			record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				got = append(got, sendertest.Delivery{KeyField: r.Header.Get(httpidem.HeaderName), Payload: b})
				mu.Unlock()
				w.WriteHeader(http.StatusCreated)
			})
			mw, err := httpidem.New(httpidem.Config{Store: memstore.New(memstore.Config{}), Principal: httpidem.NoPrincipal})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(mw(record))
			t.Cleanup(srv.Close)
			return srv.URL + "/orders", func() []sendertest.Delivery {
				mu.Lock()
				defer mu.Unlock()
				return append([]sendertest.Delivery(nil), got...)
			}
		},
		KeyField:    keyheader.Format,
		Unreachable: func(*testing.T) string { return "http://127.0.0.1:1/orders" },
		Refused: func(t *testing.T) []string {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "unknown product", http.StatusUnprocessableEntity)
			}))
			t.Cleanup(srv.Close)
			return []string{srv.URL + "/orders", "http://[::1/orders"}
		},
	})
}

func TestHTTPOutcomes(t *testing.T) {
	var mu sync.Mutex
	var gotKey, gotBody, gotOrdering string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		gotKey, gotBody, gotOrdering = r.Header.Get("Idempotency-Key"), string(b), r.Header.Get(outbox.OrderingKeyHeader)
		mu.Unlock()
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(201)
		case "/replayed":
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(200)
		case "/conflict":
			w.WriteHeader(409)
		case "/bad":
			w.WriteHeader(400)
			io.WriteString(w, "unknown product")
		case "/down":
			w.WriteHeader(503)
		case "/slow":
			time.Sleep(300 * time.Millisecond)
		}
	}))
	defer srv.Close()
	h := httpsender.New(httpsender.Config{Timeout: 100 * time.Millisecond})
	for path, want := range map[string]outbox.Status{
		"/ok": outbox.Acked, "/replayed": outbox.Acked, "/conflict": outbox.Pending, "/bad": outbox.Dead,
		"/down": outbox.Pending, "/slow": outbox.Pending,
	} {
		res := h.Send(context.Background(), &outbox.Message{Key: `ORD-"1"`, Destination: srv.URL + path, Payload: []byte("body"), OrderingKey: "acct-7"})
		if res.Status != want {
			t.Errorf("%s: %s (%v), want %s", path, res.Status, res.Err, want)
		}
		if path == "/bad" && !strings.Contains(res.Err.Error(), "unknown product") {
			t.Errorf("the 4xx answer is not recorded: %v", res.Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if gotKey != `"ORD-\"1\""` || gotBody != "body" || gotOrdering != "acct-7" {
		t.Fatalf("key header %q, body %q, ordering key %q", gotKey, gotBody, gotOrdering)
	}
	if res := h.Send(context.Background(), &outbox.Message{Key: "k", Destination: "http://127.0.0.1:1/refused"}); res.Status != outbox.Pending {
		t.Fatalf("connection refused: %s", res.Status)
	}
}

// TestHostHeaders: headers configured for a host (its credentials) go on
// every request to it — over a message's own header of the same name — and
// on no other host's; the outbox rows carry none of them.
func TestHostHeaders(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Host+" "+r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://") // 127.0.0.1:PORT
	other := "http://localhost:" + srv.Listener.Addr().(*net.TCPAddr).AddrPort().String()[len("127.0.0.1:"):]
	s := httpsender.New(httpsender.Config{HostHeaders: map[string]http.Header{host: {"Authorization": {"Bearer relay-t0ken"}}}})
	ctx := context.Background()
	for _, m := range []*outbox.Message{
		{Key: "INV-1", Destination: srv.URL + "/invoices", Payload: []byte("{}")},
		{Key: "INV-2", Destination: srv.URL + "/invoices", Payload: []byte("{}"), Headers: map[string]string{"Authorization": "Bearer row-t0ken"}},
		{Key: "INV-3", Destination: other + "/invoices", Payload: []byte("{}")},
	} {
		if res := s.Send(ctx, m); res.Status != outbox.Acked {
			t.Fatalf("%s: %s %v", m.Key, res.Status, res.Err)
		}
	}
	want := []string{host + " Bearer relay-t0ken", host + " Bearer relay-t0ken", strings.TrimPrefix(other, "http://") + " "}
	if strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Fatalf("the receiver saw %q, want %q", seen, want)
	}
}

// TestRedirectsNotFollowed: a destination that answers with a redirect
// to another host — here the one where an admin action waits — is not
// followed: the message and the host's credentials reach only the
// destination, and the row is retried later with the redirect recorded.
// With RedirectSameHost a redirect on the destination's own host is
// followed; one to another host still is not.
func TestRedirectsNotFollowed(t *testing.T) {
	var elsewhere sync.Map // what reached the other host: path → its X-Api-Key
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Store(r.URL.Path, r.Header.Get("X-Api-Key"))
	}))
	defer other.Close()
	dest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/admin/reset", http.StatusTemporaryRedirect)
		case "/moved":
			http.Redirect(w, r, "/orders", http.StatusTemporaryRedirect)
		case "/orders":
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer dest.Close()
	host := strings.TrimPrefix(dest.URL, "http://")
	creds := map[string]http.Header{host: {"X-Api-Key": {"secret"}}}
	send := func(s *httpsender.Sender, path string) outbox.Result {
		return s.Send(context.Background(), &outbox.Message{Key: "K-" + path, Destination: dest.URL + path, Payload: []byte("{}")})
	}
	plain := httpsender.New(httpsender.Config{HostHeaders: creds})
	if res := send(plain, "/away"); res.Status != outbox.Pending || res.Err == nil || !strings.Contains(res.Err.Error(), "not followed") {
		t.Fatalf("a redirect to another host: %s %v, want pending, not followed", res.Status, res.Err)
	}
	if res := send(plain, "/moved"); res.Status != outbox.Pending {
		t.Fatalf("a redirect on the same host, by default: %s %v, want pending", res.Status, res.Err)
	}
	same := httpsender.New(httpsender.Config{HostHeaders: creds, RedirectSameHost: true})
	if res := send(same, "/moved"); res.Status != outbox.Acked {
		t.Fatalf("a redirect on the same host with RedirectSameHost: %s %v, want acked", res.Status, res.Err)
	}
	if res := send(same, "/away"); res.Status != outbox.Pending {
		t.Fatalf("a redirect to another host with RedirectSameHost: %s %v, want pending", res.Status, res.Err)
	}
	elsewhere.Range(func(path, key any) bool {
		t.Errorf("the other host got %s (X-Api-Key %q)", path, key)
		return true
	})
}
