package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/console"
	"github.com/idemgo/idem/edi"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/otelidem"
	"github.com/idemgo/idem/store"
)

type serveOpts struct {
	listen, upstream, store, admin string
	adminToken                     string
	lease, retention, timeout      time.Duration
	sweep                          time.Duration
	requireKey                     bool
	waitInFlight                   time.Duration
	maxBody                        int64
	problemBase                    string
	keyFrom                        string
	fenceHeader                    string
	principal                      string
	storeSetCookie                 bool
	timeouts                       *listenerTimeouts
	adminListener                  *adminListener
}

func newServeCmd() *cobra.Command {
	var o serveOpts
	cmd := &cobra.Command{
		Use:   "serve --upstream URL",
		Short: "Run an HTTP gateway that enforces Idempotency-Key in front of any HTTP service",
		Long: `Reverse-proxies every request to --upstream. POST and PATCH requests with an
Idempotency-Key run once: duplicates get the stored response (Idempotent-Replayed: true),
409 while the first is in flight, 422 when the key comes with another request, 400 for a
bad key. The store keeps completed responses and live leases across restarts and kill -9.
The key is forwarded upstream unchanged, with the execution's fencing token in
Idempotency-Fence: it grows with every execution of a key, so an upstream that refuses writes
under a fence below the largest it applied refuses a gateway paused past its lease.

With OTEL_EXPORTER_OTLP_ENDPOINT set (OTEL_EXPORTER_OTLP_PROTOCOL grpc or http/protobuf),
each request is a server span continuing the caller's traceparent, the guarded run its
child (replayed or executed), and the upstream request carries its context.`,
		Args: cobra.NoArgs,
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve on")
	f.StringVar(&o.upstream, "upstream", "", "base URL of the service behind the gateway (required)")
	f.StringVar(&o.store, "store", "sqlite:idem.db", "store URL")
	f.StringVar(&o.admin, "admin", "", "address for the console (/), /metrics (Prometheus) and /healthz; empty: none")
	f.StringVar(&o.adminToken, "admin-token", os.Getenv("IDEM_ADMIN_TOKEN"), "token the console asks for off loopback, for every page but /healthz and /metrics (default $IDEM_ADMIN_TOKEN)")
	o.adminListener = adminListenerFlags(cmd, "admin-")
	f.DurationVar(&o.lease, "lease", time.Minute, "how long a request may run before a retry may take it over (heartbeats extend it)")
	f.DurationVar(&o.retention, "retention", 24*time.Hour, "how long responses are replayed")
	f.DurationVar(&o.timeout, "upstream-timeout", 30*time.Second, "wait this long for the upstream's response headers, and let the upstream call run this long after the client left (its answer is stored for the retry); then 504 and the key is held until its lease expires")
	f.StringVar(&o.principal, "principal", "default", "who a stored response belongs to: default (Authorization, else cookies; a keyed request with neither is forwarded unprotected, never stored or replayed), header:NAME (the header the upstream authenticates with, e.g. header:X-Api-Key, or header:X-User-Id behind an auth proxy), cookie:NAME (the session cookie) or none (one scope shared by every caller)")
	f.BoolVar(&o.storeSetCookie, "store-set-cookie", false, "store and replay the upstream's Set-Cookie (by default a retry never receives the first response's cookies)")
	f.DurationVar(&o.sweep, "sweep-interval", time.Minute, "delete records past their retention this often (0: never; Redis expires them by itself)")
	f.BoolVar(&o.requireKey, "require-key", false, "answer 400 to POST and PATCH without an Idempotency-Key")
	f.DurationVar(&o.waitInFlight, "wait-in-flight", 0, "a duplicate of a request in flight waits up to this long for the first's response instead of a 409 at once (0: the 409 at once)")
	f.Int64Var(&o.maxBody, "max-body", 1<<20, "largest request body accepted with a key (413 above)")
	f.StringVar(&o.keyFrom, "key-from", "header", "where keys come from: header (Idempotency-Key only), or edi (also the interchange's dedup key for EDI bodies posted without the header)")
	f.StringVar(&o.fenceHeader, "fence-header", httpidem.FenceHeader, "request header that hands the upstream each execution's fencing token, which grows with every execution of a key (a client's own is replaced, or removed from requests without a key); empty: none")
	f.StringVar(&o.problemBase, "problem-type-base", httpidem.DefaultProblemTypeBase, "prefix of the type links in problem+json answers")
	o.timeouts = listenerTimeoutFlags(cmd, 0)
	f.Lookup("write-timeout").Usage += " (0: --upstream-timeout + 30s)"
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if o.timeouts.write == 0 {
			// The answer may wait for the upstream as long as it is given.
			o.timeouts.write = o.timeout + 30*time.Second
		}
		return runServe(cmd.Context(), o)
	}
	return cmd
}

// gatewayMetrics are the Prometheus series of idem serve.
type gatewayMetrics struct {
	requests  *prometheus.CounterVec
	storeTime *prometheus.HistogramVec
	storeErrs *prometheus.CounterVec
	takeovers prometheus.Counter
	registry  *prometheus.Registry
	history   *console.History // the console's chart
}

func newGatewayMetrics() *gatewayMetrics {
	m := &gatewayMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_http_requests_total",
			Help: "Requests by outcome: executed, replayed, conflict, mismatch, rejected, unavailable, bypassed (no key), unscoped (a key but no principal: forwarded unprotected).",
		}, []string{"outcome"}),
		storeTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_store_operation_seconds",
			Help:    "Latency of store operations by operation (acquire, settle, heartbeat).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"op"}),
		storeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_store_errors_total",
			Help: "Store operations that failed, by operation.",
		}, []string{"op"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_lease_takeovers_total",
			Help: "Requests that took over the expired lease of a dead or stalled owner.",
		}),
		registry: prometheus.NewRegistry(),
		history:  console.NewHistory(nil),
	}
	m.registry.MustRegister(m.requests, m.storeTime, m.storeErrs, m.takeovers,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, o := range []string{"executed", "replayed", "conflict", "mismatch", "rejected", "unavailable", "bypassed"} {
		m.requests.WithLabelValues(o)
	}
	return m
}

// exportServerWarnings adds idem_store_server_warnings, the number of the
// store server's unsafe settings, read at each scrape (a setting changed
// while the gateway runs shows at the next one): NaN when they cannot be
// read. Nothing for a store without server settings.
func (m *gatewayMetrics) exportServerWarnings(st store.Store) {
	w, ok := st.(serverWarner)
	if !ok {
		return
	}
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idem_store_server_warnings",
		Help: "Settings of the store's server under which it may lose or evict acknowledged records (the warnings idem serve logs at start), read at each scrape; NaN when they cannot be read.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		warnings, err := w.ServerWarnings(ctx)
		if err != nil {
			return math.NaN()
		}
		return float64(len(warnings))
	}))
}

func (m *gatewayMetrics) request(e httpidem.Event) {
	m.requests.WithLabelValues(e.Outcome).Inc()
	m.history.Add(e.Outcome)
	if e.TakenOver {
		m.takeovers.Inc()
	}
}

func (m *gatewayMetrics) st(e idem.Event) {
	if e.Cached {
		return
	}
	m.storeTime.WithLabelValues(e.Phase).Observe(e.Duration.Seconds())
	if e.Err != nil && !errors.Is(e.Err, store.ErrStaleFence) {
		m.storeErrs.WithLabelValues(e.Phase).Inc()
	}
}

// newProxy forwards to upstream, handing it the request's fence in
// fenceHeader (when not empty) and, when traced, the trace context of the
// request's span (its caller's traceparent passes through otherwise).
func newProxy(upstream *url.URL, timeout time.Duration, fenceHeader string, traced bool, logger *log.Logger) *httputil.ReverseProxy {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.ResponseHeaderTimeout = timeout
	transport.MaxIdleConnsPerHost = 256
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
			if traced {
				w3c.Inject(pr.In.Context(), propagation.HeaderCarrier(pr.Out.Header))
			}
			fence, guarded := idem.FenceFrom(pr.In.Context())
			if fenceHeader != "" {
				pr.Out.Header.Del(fenceHeader)
				if guarded {
					pr.Out.Header.Set(fenceHeader, strconv.FormatUint(fence, 10))
				}
			}
			if guarded && (pr.Out.Body == nil || pr.Out.Body == http.NoBody) {
				// http.Transport resends a request whose connection broke
				// after it was written if it deems it replayable, and a
				// request without a body and with an Idempotency-Key (or
				// X-Idempotency-Key) header is, to it: the upstream would
				// run it twice under one claim. It looks for those names
				// as Go writes them; in lower case (as HTTP/2 sends every
				// name, and HTTP/1.1 compares them) it does not resend.
				hideFromRetries(pr.Out.Header)
			}
		},
		Transport: transport,
		ErrorLog:  logger,
		// The status says what the key becomes (httpidem.DefaultPolicy): an
		// upstream that was never reached did nothing (503, released: the
		// retry runs); one that timed out or dropped the connection after
		// the request was sent may have done the work (504 or 502, held
		// until the lease ends).
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status := http.StatusBadGateway
			var ne net.Error
			var op *net.OpError
			switch {
			case errors.As(err, &op) && op.Op == "dial":
				status = http.StatusServiceUnavailable
			case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
				status = http.StatusGatewayTimeout
			}
			logger.Printf("upstream %q %q: %v", r.Method, r.URL.Path, err) // quoted: a client wrote them
			w.WriteHeader(status)
		},
	}
}

// framing refuses, before anything else sees it, a request whose
// Connection header names the key, Authorization, Cookie or the principal's
// header (the proxy would strip them before the upstream while the scope was
// computed from them: 400), and closes the connection after any request
// sent with a Transfer-Encoding: net/http drops a Content-Length sent beside
// it, so a request that carried both (RFC 9112 §6.1) cannot be told apart,
// and the connection must not carry a pipelined request on.
func framing(next http.Handler, principalSpec string) http.Handler {
	guarded := map[string]bool{"idempotency-key": true, "authorization": true, "cookie": true}
	if kind, name, ok := strings.Cut(principalSpec, ":"); ok && kind == "header" {
		guarded[strings.ToLower(name)] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 {
			w.Header().Set("Connection", "close")
		}
		for _, v := range r.Header.Values("Connection") {
			for _, name := range strings.Split(v, ",") {
				if guarded[strings.ToLower(strings.TrimSpace(name))] {
					w.Header().Set("Connection", "close")
					http.Error(w, "the Connection header names "+strings.TrimSpace(name)+", which the gateway needs end to end", http.StatusBadRequest)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// hideFromRetries moves the key headers to their lower-case names (see
// newProxy).
func hideFromRetries(h http.Header) {
	for _, name := range [...]string{"Idempotency-Key", "X-Idempotency-Key"} {
		if v, ok := h[name]; ok {
			delete(h, name)
			h[strings.ToLower(name)] = v
		}
	}
}

func runServe(ctx context.Context, o serveOpts) error {
	if err := o.adminListener.check(); err != nil {
		return err
	}
	if o.upstream == "" {
		return errors.New("--upstream is required")
	}
	up, err := url.Parse(o.upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return fmt.Errorf("--upstream %q: want http://HOST[:PORT][/PATH] or https://…", o.upstream)
	}
	st, err := openStore(ctx, o.store)
	if err != nil {
		return err
	}
	defer st.Close()
	logger := log.New(os.Stderr, "idem serve: ", log.LstdFlags)
	logServerWarnings(ctx, st, logger)
	metrics := newGatewayMetrics()
	metrics.exportServerWarnings(st)
	tp, flushTraces, err := startTracing(ctx, "idem-serve", os.Stderr)
	if err != nil {
		return err
	}
	defer flushTraces()
	principal, err := httpidem.ParsePrincipal(o.principal)
	if err != nil {
		return fmt.Errorf("--principal: %w", err)
	}
	// The upstream call is finished without the client (FinishTimeout): a
	// client that gives up after the request reached the upstream gets the
	// stored answer on its retry instead of a second execution.
	var unscopedOnce sync.Once
	cfg := httpidem.Config{
		Store: st, Lease: o.lease, Retention: o.retention, RequireKey: o.requireKey,
		MaxBodyBytes: o.maxBody, ProblemTypeBase: o.problemBase,
		Principal: principal, StoreSetCookie: o.storeSetCookie, FinishTimeout: o.timeout, WaitInProgress: o.waitInFlight,
		Observer: func(e httpidem.Event) {
			metrics.request(e)
			if e.Outcome == "unscoped" {
				unscopedOnce.Do(func() {
					logger.Printf("a request with an Idempotency-Key but no principal (--principal %s) was forwarded unprotected; "+
						"this is logged once, idem_http_requests_total{outcome=\"unscoped\"} counts them: name the header your upstream authenticates with (--principal header:NAME)", o.principal)
				})
			}
		},
		StoreObserver: metrics.st,
	}
	if tp != nil {
		cfg.Tracer = otelidem.Tracing(tp)
	}
	switch o.keyFrom {
	case "header":
	case "edi":
		cfg.KeyFromBody = func(_ *http.Request, body []byte) (string, bool) { return edi.KeyOf(body) }
	default:
		return fmt.Errorf("--key-from %q: want header or edi", o.keyFrom)
	}
	mw, err := httpidem.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	if o.sweep > 0 {
		sw, err := idem.NewSweeper(idem.SweeperConfig{Store: st, Interval: o.sweep,
			OnPass: func(n int, err error) {
				if err != nil {
					logger.Printf("retention sweep: %v", err)
				}
			}})
		if err != nil {
			return err
		}
		if err := sw.Start(ctx); err != nil {
			return err
		}
		defer sw.Stop(context.Background())
	}
	srv := o.timeouts.server(serverSpans(tp, framing(mw(newProxy(up, o.timeout, o.fenceHeader, tp != nil, logger)), o.principal)))
	srv.ErrorLog = logger
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	var adminSrv *http.Server
	if o.admin != "" {
		aln, err := net.Listen("tcp", o.admin)
		if err != nil {
			srv.Close()
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(metrics.registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
			hctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			if _, err := st.Get(hctx, idem.Key{Scope: "idem", ID: "healthz"}.Storage(false)); err != nil && !errors.Is(err, store.ErrNotFound) {
				http.Error(w, "store: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		if err := mountConsole(mux, o.admin, o.adminListener, console.Config{Store: st, Token: o.adminToken, History: metrics.history, HistoryTitle: "Requests"}); err != nil {
			srv.Close()
			aln.Close()
			return err
		}
		adminSrv = o.timeouts.server(o.adminListener.handler(o.admin, mux))
		adminSrv.WriteTimeout = time.Minute
		go func() { errc <- o.adminListener.serve(adminSrv, aln) }()
		logger.Printf("admin on %s://%s (the console at /, /metrics, /healthz)", o.adminListener.scheme(), aln.Addr())
	}
	logger.Printf("listening on http://%s → %s (store %s)", ln.Addr(), up, o.store)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Printf("shutting down: finishing requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if adminSrv != nil {
		_ = adminSrv.Shutdown(sctx)
	}
	return err
}

// serverWarner is a store that reads its server's settings and says which
// are unsafe (redisstore, pgstore, tieredstore).
type serverWarner interface {
	ServerWarnings(context.Context) ([]string, error)
}

// logServerWarnings logs what the store says is off in its server's
// settings (redisstore.Store.ServerWarnings, pgstore.Store.ServerWarnings);
// a server that does not let it read them is logged as such.
func logServerWarnings(ctx context.Context, st store.Store, logger *log.Logger) {
	w, ok := st.(serverWarner)
	if !ok {
		return
	}
	warnings, err := w.ServerWarnings(ctx)
	if err != nil {
		logger.Printf("warning: cannot read the store server's settings (%v): check them by hand (the store's ServerWarnings says which)", err)
	}
	for _, s := range warnings {
		logger.Printf("warning: %s", s)
	}
}
