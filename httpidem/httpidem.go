package httpidem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/keyheader"
	"github.com/idemgo/idem/internal/storedresp"
	"github.com/idemgo/idem/store"
)

// Response headers set by the middleware.
const (
	// ReplayedHeader is "true" on a response replayed from the store.
	ReplayedHeader = "Idempotent-Replayed"
	// ExpiresHeader, on every response that was stored (and every replay),
	// is the HTTP-date until which the key is remembered: a retry before it
	// gets the same response; after it, the key is new again.
	ExpiresHeader = "Idempotency-Key-Expires"
	// BodyOmittedHeader is "too-large" on a replay of a response whose body
	// was larger than Config.MaxResponseBytes: the request ran, its status
	// and headers are replayed, its body was not kept.
	BodyOmittedHeader = "Idempotent-Body-Omitted"
	// HeadersOmittedHeader is "too-large" on a replay of a response whose
	// headers took more than MaxStoredHeaderBytes: the request ran, its
	// status is replayed, its headers and body were not kept.
	HeadersOmittedHeader = "Idempotent-Headers-Omitted"
)

// MaxStoredHeaderBytes bounds the headers of a stored response, as they
// are encoded. A response with more is stored with its status alone
// (HeadersOmittedHeader), so that its key is settled at once instead of
// staying in flight until its lease runs out.
const MaxStoredHeaderBytes = 64 << 10

// knownMethods are the request methods of RFC 9110 and RFC 5789. Methods
// are case-sensitive: "post" is none of them.
var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true, http.MethodPatch: true,
	http.MethodDelete: true, http.MethodConnect: true, http.MethodOptions: true, http.MethodTrace: true,
}

const ()

// OversizedBody says what to do with a request body over MaxBodyBytes.
type OversizedBody uint8

const (
	// RejectOversized answers 413 without running the handler.
	RejectOversized OversizedBody = iota
	// PassOversized runs the handler without idempotency.
	PassOversized
)

// Config configures the middleware. Store (or Guard) is required; every
// other field has a documented default.
type Config struct {
	// Store holds the keys and the stored responses. Required unless Guard
	// is set.
	Store store.Store
	// Guard, if set, runs the requests: a Guard configured like any other
	// (its store, lease, heartbeat interval, retention, cache, observer),
	// shared with the rest of the application if you like. The middleware
	// applies its own Policy whatever the Guard's Classify. With a Guard,
	// leave Store, Lease, Retention, MaxAttempts, CompactKeys and
	// StoreObserver unset: they are the Guard's.
	Guard *idem.Guard
	// Methods the middleware applies to; others pass through untouched.
	// Defaults to POST and PATCH.
	Methods []string
	// RequireKey answers 400 to a request of those methods without an
	// Idempotency-Key. Defaults to false: such requests pass through.
	RequireKey bool
	// KeyFromBody, if set, derives the key of a request that has no
	// Idempotency-Key header from its body (e.g. edi.KeyOf: the dedup key of
	// an EDI interchange); ok=false falls back to the missing-key rule.
	KeyFromBody func(r *http.Request, body []byte) (key string, ok bool)
	// MaxKeyBytes bounds the key. Defaults to 255 (the most idem allows).
	MaxKeyBytes int
	// Principal names the caller; keys are scoped by method, path and
	// principal, so a stored response is replayed only to the principal
	// that caused it. "" means no principal can be derived from the
	// request: it is then neither stored nor replayed, but passed through
	// as if it had no key (Event outcome "unscoped"), for a caller without
	// credentials must not be replayed, or even told of, another's
	// response. Defaults to DefaultPrincipal: the Authorization header,
	// else the request's cookies. See ParsePrincipal for the other choices
	// (the header the service authenticates with, one session cookie, or
	// none: one scope shared by every caller).
	Principal func(*http.Request) string
	// StoreSetCookie stores (and so replays) the response's Set-Cookie
	// fields. Defaults to false: a retry never receives a session cookie
	// minted for the first request; the first response still carries it.
	StoreSetCookie bool
	// FinishTimeout is how long the handler may keep running after its
	// client has gone: a request with a key is finished and its answer
	// stored for the retry, so the handler's context is not cancelled when
	// the client leaves, only this long after it (then the key is held
	// until its lease expires, as the work may have happened). Defaults to
	// 30s.
	FinishTimeout time.Duration
	// WaitInProgress, if positive, makes a duplicate of a request in flight
	// wait up to this long for the first to finish, and answers it with the
	// first's stored response — for clients that cannot handle a 409. Past
	// the bound, the 409 as without it. A waiter stops when its client
	// leaves; the waiters of one key share one poll of the store and are
	// woken at once when the first finishes in this process; past the
	// Guard's caps on waiters (idem.Config.MaxWaitersPerKey, MaxWaiters),
	// the 409 at once.
	WaitInProgress time.Duration
	// Fingerprint hashes what must be identical for a replay. Same key with
	// another fingerprint is answered 422 and never executed. Defaults to a
	// hash of the method, the path with query, and the body.
	Fingerprint func(r *http.Request, body []byte) string
	// MaxBodyBytes bounds the request body read for the fingerprint.
	// Defaults to 1 MiB.
	MaxBodyBytes int64
	// Oversized says what happens to a larger body. Defaults to
	// RejectOversized (413).
	Oversized OversizedBody
	// MaxResponseBytes bounds a stored response body. A larger response is
	// sent whole, and its key completed with the status and headers alone:
	// a retry is replayed them with an empty body and BodyOmittedHeader
	// (the request is not run again). Defaults to 1 MiB minus room for the
	// headers.
	MaxResponseBytes int
	// Policy maps the handler's status to what happens to the key. Defaults
	// to DefaultPolicy.
	Policy func(status int) idem.Disposition
	// Lease is how long a request may run before a retry may take it over
	// (heartbeats extend it while the handler runs). Defaults to 1m.
	Lease time.Duration
	// LeaseDeadline, if set, gives a request a time its claim must not
	// outlive (idem.RunOptions.LeaseDeadline): a process that may be
	// stopped at a known time — a Lambda invocation at its deadline — so
	// that its keys are free again when it is. The zero time means none.
	LeaseDeadline func(*http.Request) time.Time
	// Retention is how long responses are replayed. Defaults to 24h.
	Retention time.Duration
	// MaxAttempts poisons a key after this many executions (re-runs after
	// 5xx count). Defaults to 0: no limit.
	MaxAttempts int
	// CompactKeys stores SHA-256/128 of the keys. Defaults to false.
	CompactKeys bool
	// ProblemTypeBase prefixes the "type" of every problem+json answer; point
	// it at your own docs. Defaults to DefaultProblemTypeBase.
	ProblemTypeBase string
	// Observer, if set, is called once per request the middleware handled.
	Observer func(Event)
	// StoreObserver, if set, receives the guard's events (store latency,
	// takeovers).
	StoreObserver func(idem.Event)
	// Tracer, if set, traces each guarded request as the Guard's Run span
	// (otelidem.Tracing): its outcome says replayed or executed (acquired,
	// taken over), the handler's spans are its children.
	Tracer idem.Tracer
}

// DefaultProblemTypeBase documents each problem type at an anchor.
const DefaultProblemTypeBase = "https://github.com/idemgo/idem/blob/main/httpidem/PROBLEMS.md#"

// Event reports what the middleware did with one request.
type Event struct {
	// Outcome is executed, replayed, conflict (in flight), mismatch,
	// rejected (bad key or body, unknown method), unavailable (store
	// failure), bypassed (no key, or an oversized body passed through) or
	// unscoped (a key, but no principal: passed through unprotected).
	Outcome string
	// Status is the status sent to the client.
	Status int
	// TakenOver is true when the execution took over a dead owner's lease.
	TakenOver bool
	// Err is the reason for rejected and unavailable.
	Err error
}

// DefaultPolicy stores and replays 2xx, 3xx and 4xx responses except 408,
// 409, 425 and 429 (the client may succeed on retry); it releases the key on
// those and on 5xx so the retry runs again — except 502 and 504, a gateway's
// upstream that failed to answer or timed out after it was sent the request,
// which may have done the work: the key is held until the lease expires.
func DefaultPolicy(status int) idem.Disposition {
	switch {
	case status == http.StatusBadGateway || status == http.StatusGatewayTimeout:
		return idem.Hold
	case status >= 500:
		return idem.Release
	case status == 408 || status == 409 || status == 425 || status == 429:
		return idem.Release
	}
	return idem.Complete
}

type middleware struct {
	cfg     Config
	guard   *idem.Guard
	methods map[string]bool
	dates   httpDates
}

// New validates cfg and returns the middleware.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	if cfg.Guard != nil {
		if cfg.Store != nil || cfg.Lease != 0 || cfg.Retention != 0 || cfg.MaxAttempts != 0 || cfg.CompactKeys || cfg.StoreObserver != nil || cfg.Tracer != nil {
			return nil, errors.New("idem/httpidem: with Config.Guard, leave Store, Lease, Retention, MaxAttempts, CompactKeys, StoreObserver and Tracer unset: configure them on the Guard")
		}
	} else if cfg.Store == nil {
		return nil, errors.New("idem/httpidem: Config.Store (or Config.Guard) is required")
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if cfg.MaxKeyBytes == 0 {
		cfg.MaxKeyBytes = idem.MaxIDBytes
	}
	if cfg.MaxKeyBytes < 1 || cfg.MaxKeyBytes > idem.MaxIDBytes {
		return nil, fmt.Errorf("idem/httpidem: Config.MaxKeyBytes is %d, want 1 to %d", cfg.MaxKeyBytes, idem.MaxIDBytes)
	}
	if cfg.Principal == nil {
		cfg.Principal = DefaultPrincipal
	}
	if cfg.FinishTimeout == 0 {
		cfg.FinishTimeout = 30 * time.Second
	}
	if cfg.FinishTimeout < 0 {
		return nil, errors.New("idem/httpidem: Config.FinishTimeout must not be negative")
	}
	if cfg.Fingerprint == nil {
		cfg.Fingerprint = DefaultFingerprint
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, errors.New("idem/httpidem: Config.MaxBodyBytes must not be negative")
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = store.DefaultMaxResultBytes - 64<<10
	}
	if cfg.MaxResponseBytes < 0 {
		return nil, errors.New("idem/httpidem: Config.MaxResponseBytes must not be negative")
	}
	if cfg.Policy == nil {
		cfg.Policy = DefaultPolicy
	}
	if cfg.Lease == 0 {
		cfg.Lease = time.Minute
	}
	if cfg.ProblemTypeBase == "" {
		cfg.ProblemTypeBase = DefaultProblemTypeBase
	}
	g := cfg.Guard
	if g == nil {
		if cfg.Retention == 0 {
			cfg.Retention = 24 * time.Hour
		}
		var err error
		g, err = idem.NewGuard(idem.Config{
			Store: cfg.Store, Lease: cfg.Lease, Retention: cfg.Retention, MaxAttempts: cfg.MaxAttempts,
			CompactKeys: cfg.CompactKeys, Observer: cfg.StoreObserver, Tracer: cfg.Tracer,
		})
		if err != nil {
			return nil, fmt.Errorf("idem/httpidem: %w", err)
		}
	}
	cfg.Retention = g.Retention()
	m := &middleware{cfg: cfg, guard: g, methods: map[string]bool{}}
	for _, meth := range cfg.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	return m.wrap, nil
}

// AuthorizationPrincipal is a hash of the Authorization header, or "" (no
// principal) without one. The credential itself is never stored.
func AuthorizationPrincipal(r *http.Request) string {
	a := r.Header.Get("Authorization")
	if a == "" {
		return ""
	}
	return digest("auth:", a)
}

// digest is prefix followed by a hash of s (SHA-256, 96 bits in hex).
func digest(prefix, s string) string {
	sum := sha256.Sum256([]byte(s))
	var buf [40]byte
	return string(hex.AppendEncode(append(buf[:0], prefix...), sum[:12]))
}

// DefaultFingerprint hashes the method, the path with its query, and the
// body.
func DefaultFingerprint(r *http.Request, body []byte) string {
	return idem.Fingerprint([]byte(r.Method), []byte(r.URL.RequestURI()), body)
}

// dispositionError carries the policy's decision out of the guarded work
// (wrapped by idem.WithDisposition, so any Guard applies it).
type dispositionError struct {
	d      idem.Disposition
	reason string
}

func (e *dispositionError) Error() string { return e.reason }

// storeResponse tells any Guard to complete with the recorded response: one
// shared value, so the common path allocates no error.
var storeResponse = decided(idem.Complete, "response stored")

func decided(d idem.Disposition, reason string) error {
	return idem.WithDisposition(d, &dispositionError{d, reason})
}

func (m *middleware) scope(r *http.Request, principal string) string {
	s := r.Method + " " + r.URL.EscapedPath() + " " + principal
	if len(s) > idem.MaxScopeBytes || strings.ContainsFunc(s, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		sum := sha256.Sum256([]byte(s))
		s = "sha256:" + hex.EncodeToString(sum[:])
	}
	return s
}

func (m *middleware) observe(e Event) {
	if m.cfg.Observer != nil {
		m.cfg.Observer(e)
	}
}

func (m *middleware) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[r.Method] {
			if !knownMethods[r.Method] && len(r.Header.Values(HeaderName)) > 0 {
				// A method the middleware does not know ("post" is not
				// POST) with a key: refused rather than run unprotected.
				m.problem(w, http.StatusNotImplemented, "unknown-method", "Unknown method",
					"The method is not one this service knows; methods are case-sensitive.", nil)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		values := r.Header.Values(HeaderName)
		principal := ""
		if len(values) > 0 || m.cfg.KeyFromBody != nil {
			if principal = m.cfg.Principal(r); principal == "" {
				m.observe(Event{Outcome: "unscoped"})
				next.ServeHTTP(w, r)
				return
			}
		}
		if len(values) == 0 && m.cfg.KeyFromBody != nil {
			body, tooBig, err := readBody(r, m.cfg.MaxBodyBytes)
			if err == nil && !tooBig {
				if id, ok := m.cfg.KeyFromBody(r, body); ok {
					if len(id) > m.cfg.MaxKeyBytes {
						m.problem(w, http.StatusBadRequest, "malformed-key", "Malformed Idempotency-Key",
							fmt.Sprintf("The key derived from the body is %d bytes, the limit is %d.", len(id), m.cfg.MaxKeyBytes), nil)
						return
					}
					m.serve(w, r, next, idem.Key{Scope: m.scope(r, principal), ID: id}, body)
					return
				}
			}
		}
		switch {
		case len(values) == 0 && !m.cfg.RequireKey:
			m.observe(Event{Outcome: "bypassed"})
			next.ServeHTTP(w, r)
			return
		case len(values) == 0:
			m.problem(w, http.StatusBadRequest, "missing-key", "Idempotency-Key required",
				"This endpoint requires an Idempotency-Key header.", nil)
			return
		case len(values) > 1:
			m.problem(w, http.StatusBadRequest, "malformed-key", "Malformed Idempotency-Key",
				"The request has more than one Idempotency-Key header.", nil)
			return
		}
		id, err := keyheader.Parse(values[0], m.cfg.MaxKeyBytes)
		if err != nil {
			m.problem(w, http.StatusBadRequest, "malformed-key", "Malformed Idempotency-Key", err.Error()+".", err)
			return
		}
		body, tooBig, err := readBody(r, m.cfg.MaxBodyBytes)
		if err != nil {
			m.problem(w, http.StatusBadRequest, "unreadable-body", "Unreadable request body", err.Error(), err)
			return
		}
		if tooBig {
			if m.cfg.Oversized == PassOversized {
				m.observe(Event{Outcome: "bypassed"})
				next.ServeHTTP(w, r)
				return
			}
			m.problem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
				fmt.Sprintf("Requests with an Idempotency-Key may carry at most %d bytes.", m.cfg.MaxBodyBytes), nil)
			return
		}
		m.serve(w, r, next, idem.Key{Scope: m.scope(r, principal), ID: id}, body)
	})
}

// presizedBodyBytes bounds the buffer readBody sizes from Content-Length.
const presizedBodyBytes = 64 << 10

// readBody reads up to limit bytes. When the body is larger it reports
// tooBig and leaves r.Body able to replay everything (for PassOversized).
func readBody(r *http.Request, limit int64) (body []byte, tooBig bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	if n := r.ContentLength; n >= 0 && n <= min(limit, presizedBodyBytes) {
		// A short body of known length: read it into a buffer of that size,
		// then make sure nothing follows. (A longer one grows as it
		// arrives: a declared length alone commits no memory.)
		body = make([]byte, n)
		if _, err = io.ReadFull(r.Body, body); err != nil {
			return nil, false, fmt.Errorf("reading the body: %v", err)
		}
		var probe [1]byte
		m, err := r.Body.Read(probe[:])
		switch {
		case m == 0 && err == io.EOF:
			r.Body = newBodyReader(body)
			return body, false, nil
		case m == 0 && err != nil:
			return nil, false, fmt.Errorf("reading the body: %v", err)
		}
		body = append(body, probe[:m]...)
	}
	rest, err := io.ReadAll(io.LimitReader(r.Body, limit+1-int64(len(body))))
	body = append(body, rest...)
	if err != nil {
		return nil, false, fmt.Errorf("reading the body: %v", err)
	}
	if int64(len(body)) > limit {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		return nil, true, nil
	}
	r.Body = newBodyReader(body)
	return body, false, nil
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, key idem.Key, body []byte) {
	fp := m.cfg.Fingerprint(r, body)
	// A request with a key runs to its end even when its client leaves
	// (FinishTimeout), so that the retry is answered what it did; but
	// never past its lease: the Guard runs it under a context the client
	// does not end, and cancels the handler's when its lease runs out.
	run := finishWithoutClient(r.Context(), m.cfg.FinishTimeout)
	defer run.stop()
	var rec *recorder
	work := func(hctx context.Context, fence uint64) ([]byte, error) {
		rec = &recorder{ResponseWriter: w, limit: m.cfg.MaxResponseBytes, advertise: m}
		next.ServeHTTP(rec, r.WithContext(hctx))
		if hctx.Err() != nil && (!rec.wroteFinal || m.cfg.Policy(rec.status) != idem.Complete) {
			// Cancelled (finish timeout, lost lease) before a storable
			// answer: the work may have happened. Hold.
			if !rec.wroteFinal {
				rec.WriteHeader(http.StatusServiceUnavailable)
			}
			why := context.Cause(hctx)
			if run.clientGone() {
				why = errClientGone
			}
			return nil, decided(idem.Hold, "handler cancelled: "+why.Error())
		}
		if !rec.wroteFinal {
			rec.WriteHeader(http.StatusOK)
		}
		d := m.cfg.Policy(rec.status)
		if d == idem.Complete && rec.overflow {
			// The request ran: a retry must not run it again. Its status
			// and headers are kept, its body is not (nor what described it).
			h := storable(rec.header, m.cfg.StoreSetCookie)
			h.Del("Content-Length")
			h.Del("Content-Encoding")
			h.Set(BodyOmittedHeader, "too-large")
			return storedresp.Encode(rec.status, h, nil), storeResponse
		}
		if d == idem.Complete {
			h := storable(rec.header, m.cfg.StoreSetCookie)
			if headerBytes(h) > MaxStoredHeaderBytes {
				// The request ran: keep its status, so a retry is answered
				// at once and not run again.
				return storedresp.Encode(rec.status, http.Header{HeadersOmittedHeader: {"too-large"}}, nil), storeResponse
			}
			return storedresp.Encode(rec.status, h, rec.body.Bytes()), storeResponse
		}
		return nil, decided(d, "status "+strconv.Itoa(rec.status))
	}
	opts := &idem.RunOptions{Fingerprint: fp, WaitInProgress: m.cfg.WaitInProgress, WaitContext: r.Context()}
	if m.cfg.LeaseDeadline != nil {
		opts.LeaseDeadline = m.cfg.LeaseDeadline(r)
	}
	res, err := m.guard.Run(run, key, opts, work)
	if res.Outcome.Owns() {
		// The handler ran and answered; err is the policy's reason or a
		// failure to settle, which the observer hears about.
		if _, ok := errors.AsType[*dispositionError](err); ok {
			err = nil
		}
		m.observe(Event{Outcome: "executed", Status: rec.status, TakenOver: res.Outcome == store.TakenOver, Err: err})
		return
	}
	if err != nil {
		if errors.Is(err, idem.ErrInvalidKey) {
			m.problem(w, http.StatusBadRequest, "malformed-key", "Malformed Idempotency-Key", err.Error(), err)
			return
		}
		m.problem(w, http.StatusServiceUnavailable, "store-unavailable", "Idempotency store unavailable",
			"The request was not executed: its key could not be claimed. Retry later with the same key.", err)
		return
	}
	switch res.Outcome {
	case store.Replayed:
		m.replay(w, res)
	case store.InProgress:
		w.Header().Set("Retry-After", "1")
		m.problemOutcome(w, http.StatusConflict, "conflict", "Request in progress",
			"A request with this Idempotency-Key is being processed. Retry later with the same key.")
	case store.Mismatch:
		m.problemOutcome(w, http.StatusUnprocessableEntity, "mismatch", "Idempotency-Key reused",
			"This Idempotency-Key was used with a different request. Use a new key for a new request.")
	case store.Poisoned:
		m.problemOutcome(w, http.StatusConflict, "poisoned", "Too many attempts",
			"Requests with this Idempotency-Key failed too many times; it is not executed again. Use a new key.")
	}
}

func (m *middleware) replay(w http.ResponseWriter, res idem.Result) {
	extra := [2]storedresp.Field{{Name: ReplayedHeader, Value: "true"}}
	n := 1
	if !res.Record.ExpiresAt.IsZero() {
		extra[1] = storedresp.Field{Name: ExpiresHeader, Value: m.dates.format(res.Record.ExpiresAt)}
		n = 2
	}
	status, body, err := storedresp.DecodeInto(res.Value, w.Header(), extra[:n]...)
	if err != nil {
		m.problem(w, http.StatusInternalServerError, "corrupt-record", "Stored response unreadable", err.Error(), err)
		return
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	m.observe(Event{Outcome: "replayed", Status: status})
}

var outcomeOf = map[int]string{http.StatusConflict: "conflict", http.StatusUnprocessableEntity: "mismatch"}

func (m *middleware) problemOutcome(w http.ResponseWriter, status int, slug, title, detail string) {
	writeProblem(w, m.cfg.ProblemTypeBase, status, slug, title, detail)
	m.observe(Event{Outcome: outcomeOf[status], Status: status})
}

func (m *middleware) problem(w http.ResponseWriter, status int, slug, title, detail string, err error) {
	writeProblem(w, m.cfg.ProblemTypeBase, status, slug, title, detail)
	outcome := "rejected"
	if status >= 500 {
		outcome = "unavailable"
	}
	if err == nil {
		err = errors.New(detail)
	}
	m.observe(Event{Outcome: outcome, Status: status, Err: err})
}

// hopByHop are never stored: they describe one connection, not the response.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Date", ReplayedHeader}

// headerBytes is about what h takes encoded: names, values and separators.
func headerBytes(h http.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// advertiseExpiry sets the Idempotency-Key-Expires field of a response with
// status that will be stored.
func (m *middleware) advertiseExpiry(status int, h http.Header) {
	if m.cfg.Policy(status) == idem.Complete {
		h.Set(ExpiresHeader, m.dates.format(time.Now().Add(m.cfg.Retention)))
	}
}

// httpDates formats times as HTTP dates (http.TimeFormat), keeping the
// text of the last second formatted: a server's responses of one second
// share it.
type httpDates struct{ last atomic.Pointer[httpDate] }

type httpDate struct {
	unix int64
	text string
}

func (d *httpDates) format(t time.Time) string {
	unix := t.Unix()
	if p := d.last.Load(); p != nil && p.unix == unix {
		return p.text
	}
	var buf [len(http.TimeFormat)]byte
	text := string(appendHTTPDate(buf[:0], t))
	d.last.Store(&httpDate{unix: unix, text: text})
	return text
}

// appendHTTPDate appends t as t.UTC().Format(http.TimeFormat) does, for a
// year of four digits, without parsing the layout each time.
func appendHTTPDate(b []byte, t time.Time) []byte {
	t = t.UTC()
	if y := t.Year(); y < 1000 || y > 9999 {
		return t.AppendFormat(b, http.TimeFormat)
	}
	two := func(b []byte, n int) []byte { return append(b, byte('0'+n/10), byte('0'+n%10)) }
	year, month, day := t.Date()
	hour, minute, second := t.Clock()
	b = append(b, t.Weekday().String()[:3]...)
	b = append(b, ", "...)
	b = two(b, day)
	b = append(b, ' ')
	b = append(b, month.String()[:3]...)
	b = append(b, ' ')
	b = two(two(b, year/100), year%100)
	b = append(b, ' ')
	b = two(b, hour)
	b = append(b, ':')
	b = two(b, minute)
	b = append(b, ':')
	b = two(b, second)
	return append(b, " GMT"...)
}

func storable(h http.Header, setCookie bool) http.Header {
	if !setCookie {
		h.Del("Set-Cookie")
	}
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
	return h
}

// bodyReader is a request body read into memory, handed on to the handler:
// bytes.Reader with a Close that does nothing, in one allocation.
type bodyReader struct{ bytes.Reader }

func newBodyReader(b []byte) *bodyReader {
	r := &bodyReader{}
	r.Reset(b)
	return r
}

func (*bodyReader) Close() error { return nil }
