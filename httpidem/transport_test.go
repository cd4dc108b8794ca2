package httpidem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// TestTransportRetriesWithOneKey: a POST through httpidem.Transport, to a
// service behind the middleware, behind a proxy that cuts the first
// response after the service ran: the Transport sends the request again
// with the key it made, the service runs once, and the caller gets the
// replay of that run's answer.
func TestTransportRetriesWithOneKey(t *testing.T) {
	var runs atomic.Int32
	s := memstore.New(memstore.Config{})
	defer s.Close()
	mw, err := httpidem.New(httpidem.Config{Store: s, Principal: httpidem.NoPrincipal})
	if err != nil {
		t.Fatal(err)
	}
	svc := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, string(body)+" booked, run "+string(rune('0'+n)))
	})))
	defer svc.Close()
	proxy := testenv.StartCuttingProxy(t, svc.URL)

	client := &http.Client{Transport: &httpidem.Transport{BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond}}
	req, _ := http.NewRequest(http.MethodPost, proxy.URL+"/payments", bytes.NewReader([]byte("PAY-1")))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(body) != "PAY-1 booked, run 1" || !httpidem.Replayed(resp) || runs.Load() != 1 {
		t.Fatalf("%d %q (replayed %v) after %d runs", resp.StatusCode, body, httpidem.Replayed(resp), runs.Load())
	}
	if keys := proxy.Keys(); len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("the attempts carried keys %q, want one key twice", keys)
	}
	if req.Header.Get(httpidem.HeaderName) != "" {
		t.Fatal("the caller's request was changed")
	}
}

// TestTransportLeavesOthersAlone: a GET, and a POST whose body cannot be
// read again, are sent once, whatever the answer.
func TestTransportLeavesOthersAlone(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	client := &http.Client{Transport: &httpidem.Transport{BackoffMin: time.Millisecond}}
	get, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	post, _ := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader("once"))) // no GetBody
	for _, req := range []*http.Request{get, post} {
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls, want 2", n)
	}
}

// TestTransportHonoursRetryAfter: a 409 (the key in flight) is retried
// after the Retry-After it carries, with the caller's own key.
func TestTransportHonoursRetryAfter(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get(httpidem.HeaderName))
		n := len(keys)
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	var waited []time.Duration
	tr := &httpidem.Transport{}
	httpidem.SetTransportWait(tr, func(_ context.Context, d time.Duration) error { waited = append(waited, d); return nil })
	client := &http.Client{Transport: tr}
	req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("x"))
	req.Header.Set(httpidem.HeaderName, `"MY-KEY"`)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != http.StatusOK || len(keys) != 2 || len(waited) != 1 || waited[0] != 3*time.Second || keys[0] != `"MY-KEY"` || keys[1] != keys[0] {
		t.Fatalf("%d after %d attempts, waits %v, keys %q", resp.StatusCode, len(keys), waited, keys)
	}
}

// TestDuplicatesWaitForTheFirst: with Config.WaitInProgress, 50 concurrent
// requests under one key: one execution, 49 replays of its response, none
// answered 409, none waiting past the bound.
func TestDuplicatesWaitForTheFirst(t *testing.T) {
	const bound = 5 * time.Second
	s := memstore.New(memstore.Config{})
	defer s.Close()
	var waiting atomic.Int32 // acquisitions that found the key in progress
	mw, err := httpidem.New(httpidem.Config{Store: s, Principal: httpidem.NoPrincipal, WaitInProgress: bound,
		StoreObserver: func(e idem.Event) {
			if e.Phase == "acquire" && e.Outcome == store.InProgress {
				waiting.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "booked once")
	})))
	defer srv.Close()
	post := func() (*http.Response, time.Duration) {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader("PAY-1"))
		req.Header.Set(httpidem.HeaderName, `"PAY-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return nil, 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, time.Since(start)
	}
	go post()
	<-started
	var wg sync.WaitGroup
	var replays atomic.Int32
	var longest atomic.Int64
	for range 49 {
		wg.Go(func() {
			resp, took := post()
			longest.Store(max(longest.Load(), int64(took)))
			if resp != nil && resp.StatusCode == http.StatusCreated && httpidem.Replayed(resp) {
				replays.Add(1)
			}
		})
	}
	for waiting.Load() < 49 { // every duplicate found the key in progress, and waits
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if runs.Load() != 1 || replays.Load() != 49 || time.Duration(longest.Load()) > bound {
		t.Fatalf("%d runs, %d replays, the longest wait %v", runs.Load(), replays.Load(), time.Duration(longest.Load()))
	}
}

// askingStore counts the claims and reads its store gets.
type askingStore struct {
	store.Store
	asks atomic.Int64
}

func (c *askingStore) Acquire(ctx context.Context, req store.AcquireRequest) (store.Acquisition, error) {
	c.asks.Add(1)
	return c.Store.Acquire(ctx, req)
}

func (c *askingStore) Get(ctx context.Context, key string) (store.Record, error) {
	c.asks.Add(1)
	return c.Store.Get(ctx, key)
}

// TestWaitersStopWhenTheirClientsLeave: duplicates waiting for a request
// in flight stop asking the store once their clients leave: after the 20
// clients gave up, the store hears nothing more of them, not a claim every
// few milliseconds each (the first request still runs).
func TestWaitersStopWhenTheirClientsLeave(t *testing.T) {
	mem := memstore.New(memstore.Config{})
	defer mem.Close()
	s := &askingStore{Store: mem}
	mw, err := httpidem.New(httpidem.Config{Store: s, Principal: httpidem.NoPrincipal, WaitInProgress: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
	})))
	defer srv.Close()
	post := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader("PAY-1"))
		req.Header.Set(httpidem.HeaderName, `"PAY-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	first := make(chan error, 1)
	go func() { first <- post(context.Background()) }()
	<-started
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			if post(ctx) == nil {
				t.Error("a waiting duplicate was answered before its client left")
			}
		})
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond) // the server sees the clients gone; the shared poll ends
	before := s.asks.Load()
	time.Sleep(time.Second)
	n := s.asks.Load() - before
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 || n > 0 {
		t.Fatalf("%d runs; %d store claims and reads in the second after the 20 clients left", runs.Load(), n)
	}
}

// TestTransportReadsRetryAfterDates: a Retry-After given as an HTTP-date
// (RFC 9110 allows it beside seconds) is waited for, up to BackoffMax.
func TestTransportReadsRetryAfterDates(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", time.Now().Add(3*time.Second).UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	var waited []time.Duration
	tr := &httpidem.Transport{}
	httpidem.SetTransportWait(tr, func(_ context.Context, d time.Duration) error { waited = append(waited, d); return nil })
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(waited) != 1 || waited[0] < time.Second || waited[0] > 3*time.Second {
		t.Fatalf("%d, waited %v; want one wait of about 3s", resp.StatusCode, waited)
	}
}
