package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	peer "github.com/faustbrian/go-idempotency"
	"github.com/faustbrian/go-idempotency/idempotencyhttp"
	"github.com/faustbrian/go-idempotency/memory"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/store/memstore"
)

// noMiddleware names the side that serves the handler bare.
const noMiddleware = "no middleware"

// payments is the handler behind every server: a 201 and a short body.
var payments = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(result)
})

// httpComparisons serves the handler three ways on loopback — bare, behind
// idem's httpidem and behind the peer's idempotencyhttp, each on its memory
// store — and drives each with 8 keep-alive clients: fresh keys, then
// replays of 100 keys. The bare server is driven the same way (its
// requests carry the key, which it ignores).
func httpComparisons(_ context.Context, cfg config) ([]comparison, error) {
	const workers = 8
	fresh := cfg.ops(40_000)
	replayed := cfg.ops(60_000)

	idemMW, peerMW, err := middlewares()
	if err != nil {
		return nil, err
	}

	var servers []*http.Server
	serve := func(h http.Handler) (string, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		go func() { _ = srv.Serve(ln) }()
		return "http://" + ln.Addr().String() + "/payments", nil
	}
	bareURL, err := serve(payments)
	if err != nil {
		return nil, err
	}
	idemURL, err := serve(idemMW(payments))
	if err != nil {
		return nil, err
	}
	peerURL, err := serve(peerMW(payments))
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}}

	var round atomic.Int64
	post := func(url, key string) error {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("amount=2500"))
		if err != nil {
			return err
		}
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		req.Header.Set("Authorization", "Bearer bench")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("%s answered %s", url, resp.Status)
		}
		return nil
	}
	freshSide := func(name, url string) side {
		return side{name: name, round: func() (measured, error) {
			prefix := "f" + strconv.FormatInt(round.Add(1), 10) + "-"
			return drive(workers, fresh, func(i int) error { return post(url, prefix+strconv.Itoa(i)) })
		}}
	}
	replaySide := func(name, url string) side {
		return side{name: name, round: func() (measured, error) {
			return drive(workers, replayed, func(i int) error { return post(url, "replay-"+strconv.Itoa(i%100)) })
		}}
	}
	closeAll := func() {
		for _, s := range servers {
			_ = s.Close()
		}
		client.CloseIdleConnections()
	}
	return []comparison{
		{name: fmt.Sprintf("http middleware, memory store, fresh keys, %d clients", workers), sides: []side{
			freshSide("idem httpidem", idemURL), freshSide("peer idempotencyhttp", peerURL), freshSide(noMiddleware, bareURL),
		}},
		{name: fmt.Sprintf("http middleware, memory store, replays of 100 keys, %d clients", workers), sides: []side{
			replaySide("idem httpidem", idemURL), replaySide("peer idempotencyhttp", peerURL), replaySide(noMiddleware, bareURL),
		}, close: closeAll},
	}, nil
}

// middlewares returns each library's middleware on a memory store of its
// own, configured alike: keys scoped by method, path and the Authorization
// header, fingerprints of the method, the path with query and the body.
func middlewares() (idemMW, peerMW func(http.Handler) http.Handler, err error) {
	idemMW, err = httpidem.New(httpidem.Config{Store: memstore.New(memstore.Config{})})
	if err != nil {
		return nil, nil, err
	}
	peerStore, err := memory.New(memory.Options{Clock: wallClock{}, OwnerTokens: ownerTokens(), MaxRecords: memory.MaxRecordCapacity})
	if err != nil {
		return nil, nil, err
	}
	svc, err := peer.NewService(peerStore)
	if err != nil {
		return nil, nil, err
	}
	mw, err := idempotencyhttp.New(idempotencyhttp.Options{
		Service: svc, Lease: time.Minute,
		// Scoped like httpidem's keys: by method, path and the caller's
		// credentials.
		Key: func(r *http.Request, value string) (peer.Key, error) {
			return peer.NewKey("bench", "tenant", r.Method+" "+r.URL.Path, r.Header.Get("Authorization"), value)
		},
		// Like httpidem's default fingerprint: method, path with query, body.
		Fingerprint: func(r *http.Request) (peer.Fingerprint, error) {
			body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err != nil {
				return peer.Fingerprint{}, err
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			canonical := append([]byte(r.Method+" "+r.URL.RequestURI()+"\n"), body...)
			return peer.NewFingerprint("v1", canonical)
		},
	})
	if err != nil {
		return nil, nil, err
	}

	return idemMW, mw.Handler, nil
}

// handlerComparisons calls each middleware's handler directly, with an
// in-memory request and response writer: what the middleware itself costs,
// without the HTTP stack.
func handlerComparisons(_ context.Context, cfg config) ([]comparison, error) {
	const workers = 8
	call := func(h http.Handler, key string) error {
		// As a server gives it: a context that ends when the client leaves.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://bench/payments", strings.NewReader("amount=2500"))
		if err != nil {
			return err
		}
		r.Header.Set("Idempotency-Key", `"`+key+`"`)
		r.Header.Set("Authorization", "Bearer bench")
		w := &discardWriter{header: http.Header{}}
		h.ServeHTTP(w, r)
		if w.status != http.StatusCreated {
			return fmt.Errorf("answered %d", w.status)
		}
		return nil
	}
	// Each round calls a handler made for it (so the stores start empty):
	// which returns the handler of one side.
	type which func(idemMW, peerMW func(http.Handler) http.Handler) http.Handler
	idemSide := func(i, _ func(http.Handler) http.Handler) http.Handler { return i(payments) }
	peerSide := func(_, p func(http.Handler) http.Handler) http.Handler { return p(payments) }
	floorSide := func(_, _ func(http.Handler) http.Handler) http.Handler { return replayFloor(payments) }
	bareSide := func(_, _ func(http.Handler) http.Handler) http.Handler { return payments }
	type named struct {
		name    string
		handler which
	}
	sides := func(n int, key func(i int) string, floor bool) []side {
		var out []side
		all := []named{{"idem httpidem", idemSide}, {"peer idempotencyhttp", peerSide}}
		if floor {
			all = append(all, named{floorName, floorSide})
		}
		for _, s := range append(all, named{noMiddleware, bareSide}) {
			out = append(out, side{name: s.name, round: func() (measured, error) {
				idemMW, peerMW, err := middlewares()
				if err != nil {
					return measured{}, err
				}
				h := s.handler(idemMW, peerMW)
				for i := range 100 { // the keys replayed
					if err := call(h, "replay-"+strconv.Itoa(i)); err != nil {
						return measured{}, err
					}
				}
				return drive(workers, n, func(i int) error { return call(h, key(i)) })
			}})
		}
		return out
	}
	fresh := func(i int) string { return "fresh-" + strconv.Itoa(i) }
	replay := func(i int) string { return "replay-" + strconv.Itoa(i%100) }
	return []comparison{
		{name: fmt.Sprintf("http middleware called in memory (no network), fresh keys, %d goroutines", workers), sides: sides(cfg.ops(200_000), fresh, false)},
		{name: fmt.Sprintf("http middleware called in memory (no network), replays of 100 keys, %d goroutines", workers), sides: sides(cfg.ops(400_000), replay, true)},
	}, nil
}

// discardWriter is a response writer that keeps the status only.
type discardWriter struct {
	header http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.header }
func (w *discardWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}
func (w *discardWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(b), nil
}

// floorName names the replay floor's side.
const floorName = "floor: the least a replay does"

// replayFloor is the least work a middleware configured as the two above
// does to replay a response: the key from its header, scoped by method,
// path and credentials; a SHA-256 fingerprint of the method, the path with
// query and the body; a lookup in a map under a lock; the stored status,
// fields and body written with Idempotent-Replayed. It records a first
// response and replays it, and does nothing else — no leases, expiry,
// concurrent requests, limits or checks of the key — so no middleware that
// keeps those guarantees replays for less: what it adds is a floor under
// the ratio of two middlewares' replay costs.
func replayFloor(next http.Handler) http.Handler {
	type stored struct {
		fp     [sha256.Size]byte
		status int
		header http.Header
		body   []byte
	}
	var mu sync.Mutex
	records := map[string]*stored{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if key == "" || err != nil {
			http.Error(w, "a key and a body", http.StatusBadRequest)
			return
		}
		h := sha256.New()
		_, _ = io.WriteString(h, r.Method+" "+r.URL.RequestURI()+"\n")
		_, _ = h.Write(body)
		var fp [sha256.Size]byte
		h.Sum(fp[:0])
		scope := r.Method + " " + r.URL.Path + "\x00" + r.Header.Get("Authorization") + "\x00" + key
		mu.Lock()
		s := records[scope]
		mu.Unlock()
		if s == nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			s = &stored{fp: fp, status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
			mu.Lock()
			records[scope] = s
			mu.Unlock()
		} else if s.fp != fp {
			http.Error(w, "another request under this key", http.StatusUnprocessableEntity)
			return
		}
		for k, v := range s.header {
			w.Header()[k] = v
		}
		w.Header()["Idempotent-Replayed"] = []string{"true"}
		w.WriteHeader(s.status)
		_, _ = w.Write(s.body)
	})
}
