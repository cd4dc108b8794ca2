// Package console is the operator's console in the browser: what is stuck,
// what is dead and why, what happened to an intent, and retrying it —
// over an idempotency store, an outbox and an inbox, any of them optional.
//
// Pages are rendered on the server (html/template: every key, payload and
// error is escaped) and readable without JavaScript; a small embedded
// script refreshes the overview. Lists page by keyset (after the last key
// or id shown), so a page costs the same on a million rows. Every write is
// a POST carrying a CSRF token. On a loopback listener the console answers
// only requests addressed to a loopback name (or one of AllowedHosts), so a
// web page that rebinds its own name to 127.0.0.1 gets nothing from it.
// Off loopback every page but /login and its assets needs the admin token,
// given once on /login (attempts are rate-limited) and kept in the browser
// session.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/store"
)

//go:embed assets
var assets embed.FS

// Inbox is what the console reads of a transactional inbox
// (*inbox.Inbox[TTx] of any driver).
type Inbox interface {
	List(ctx context.Context, consumer, afterConsumer, afterID string, limit int) ([]inbox.Row, error)
	Find(ctx context.Context, correlationID string) ([]inbox.Row, error)
}

// Config configures a Console; every source is optional.
type Config struct {
	// Store holds idempotency records.
	Store store.Store
	// Outbox holds outgoing messages.
	Outbox *outbox.Store
	// Inbox holds processed keys.
	Inbox Inbox
	// StoreURL, with its password redacted, is named in the hint shown
	// where a table of idem's is missing (run idem migrate --store URL).
	StoreURL string
	// Token is the admin token a browser presents (on /login) before a
	// write, unless Loopback.
	Token string
	// Loopback is true when the console is served on a loopback address
	// only: pages and writes then need no token (the CSRF token still
	// applies to writes), and requests addressed to any Host but a
	// loopback name or AllowedHosts are refused (421).
	Loopback bool
	// AllowedHosts are host names, besides localhost and loopback
	// addresses, a loopback console answers to (a name in /etc/hosts, an
	// SSH tunnel's). Off loopback the admin token guards every page and
	// Host is not checked.
	AllowedHosts []string
	// SecureCookies marks the session and CSRF cookies Secure: set it when
	// the console is served over TLS.
	SecureCookies bool
	// History, if set, is the process's own outcomes per minute, drawn on
	// the overview (idem serve: requests; idem relay: sends).
	History *History
	// HistoryTitle names what History counts. Defaults to "Outcomes".
	HistoryTitle string
	// PageSize is the rows per page. Defaults to 50.
	PageSize int
	// Now tells the time (lease time left, ages). Defaults to time.Now.
	Now func() time.Time
}

// Console is the console's http.Handler.
type Console struct {
	cfg    Config
	secret []byte // signs sessions
	pages  map[string]*template.Template
	mux    *http.ServeMux
	logins loginLimiter
}

// New checks cfg and returns the console. A console that is not on
// loopback needs a Token: without one it could never write, and reading
// keys and payloads from anywhere is a decision for the caller's listener.
func New(cfg Config) (*Console, error) {
	if !cfg.Loopback && cfg.Token == "" {
		return nil, errors.New("idem/console: off loopback, Config.Token is required (writes need it)")
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Console{cfg: cfg, secret: make([]byte, 32), pages: map[string]*template.Template{}}
	if _, err := rand.Read(c.secret); err != nil {
		return nil, err
	}
	funcs := template.FuncMap{
		"display": store.DisplayKey,
		"redact":  outbox.RedactDestination,
		"preview": preview,
		"result":  resultSummary,
		"detail":  resultDetail,
		"since":   func(t time.Time) string { return humanDuration(c.cfg.Now().Sub(t)) },
		"until":   func(t time.Time) string { return humanDuration(t.Sub(c.cfg.Now())) },
		"stamp":   func(t time.Time) string { return stamp(t) },
	}
	for _, name := range []string{"overview", "keys", "confirm", "outbox", "row", "find", "login", "message"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("idem/console: template %s: %w", name, err)
		}
		c.pages[name] = t
	}
	static, _ := fs.Sub(assets, "assets")
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/static/favicon.svg", http.StatusMovedPermanently)
	})
	m.HandleFunc("GET /{$}", c.read(c.overview))
	m.HandleFunc("GET /keys", c.read(c.keys))
	m.HandleFunc("POST /keys/forget", c.write(c.forget))
	m.HandleFunc("GET /outbox", c.read(c.outboxList))
	m.HandleFunc("GET /outbox/row", c.read(c.outboxRow))
	m.HandleFunc("POST /outbox/retry", c.write(c.retry))
	m.HandleFunc("POST /outbox/skip", c.write(c.skip))
	m.HandleFunc("POST /outbox/retry-dead", c.write(c.retryDead))
	m.HandleFunc("GET /find", c.read(c.find))
	m.HandleFunc("GET /login", c.loginForm)
	m.HandleFunc("POST /login", c.login)
	c.mux = m
	return c, nil
}

// ServeHTTP implements http.Handler.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Loopback && !LoopbackHost(r.Host, c.cfg.AllowedHosts) {
		misdirected(w)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	c.mux.ServeHTTP(w, r)
}

// LoopbackHost reports whether host (a Host header: name or address,
// with or without a port) is localhost, a loopback address, or one of
// allowed.
func LoopbackHost(host string, allowed []string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	if strings.EqualFold(name, "localhost") {
		return true
	}
	if ip := net.ParseIP(name); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(name, a) {
			return true
		}
	}
	return false
}

// LoopbackHostOnly serves next only to requests addressed to a loopback
// name or one of allowed (LoopbackHost), and answers any other 421: for
// every handler on a loopback listener, which a page in the operator's
// browser can reach by rebinding its own name to 127.0.0.1.
func LoopbackHostOnly(next http.Handler, allowed []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !LoopbackHost(r.Host, allowed) {
			misdirected(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func misdirected(w http.ResponseWriter) {
	http.Error(w, "this listener answers only to loopback names", http.StatusMisdirectedRequest)
}

// IsLoopback reports whether addr (host:port) listens on loopback only.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// page is what every template gets.
type page struct {
	Title     string
	CSRF      string
	CanWrite  bool
	Flash     string
	Error     string
	HasStore  bool
	HasOutbox bool
	HasInbox  bool
	Data      any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	p := page{Title: title, CSRF: c.csrfToken(w, r), CanWrite: c.cfg.Loopback || c.session(r),
		Flash: r.URL.Query().Get("done"), HasStore: c.cfg.Store != nil, HasOutbox: c.cfg.Outbox != nil, HasInbox: c.cfg.Inbox != nil, Data: data}
	if err, ok := data.(error); ok {
		p.Error, p.Data = c.describe(err), nil
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := c.pages[name].Execute(w, p); err != nil {
		http.Error(w, "rendering: "+err.Error(), http.StatusInternalServerError)
	}
}

// --- sessions and CSRF ---

const sessionCookie, csrfCookie = "idem_console_session", "idem_console_csrf"

func (c *Console) sign(v string) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte(v))
	return hex.EncodeToString(m.Sum(nil))
}

// session reports whether the browser presented the admin token earlier.
func (c *Console) session(r *http.Request) bool {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return false
	}
	exp, sig, ok := strings.Cut(ck.Value, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(c.sign("session:"+exp))) {
		return false
	}
	n, err := strconv.ParseInt(exp, 10, 64)
	return err == nil && c.cfg.Now().Unix() < n
}

// csrfToken returns the browser's CSRF token, setting a new one when it has
// none: a random value in a SameSite=Strict cookie, echoed by every form
// (double submit).
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 64 {
		return ck.Value
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: tok, Path: "/", HttpOnly: true, Secure: c.cfg.SecureCookies, SameSite: http.SameSiteStrictMode})
	return tok
}

// read wraps a page: off loopback it needs a session signed in with the
// admin token.
func (c *Console) read(h func(w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !c.cfg.Loopback && !c.session(r) {
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		h(w, r)
	}
}

// loginLimiter limits sign-in attempts, right or wrong, so that guessing
// the token costs time whoever asks: each client address may make
// loginBurst attempts at once and one more every loginEvery, and all
// clients together globalBurst at once and one more every globalEvery —
// a stranger at one attempt a second is held by its own bucket, and
// leaves the operator's attempts alone.
type loginLimiter struct {
	mu      sync.Mutex
	global  bucket
	clients map[string]*bucket
}

const (
	loginBurst  = 5
	loginEvery  = 10 * time.Second
	globalBurst = 30
	globalEvery = time.Second
	// maxClients bounds the buckets kept: past it, those full again are
	// forgotten, and if none is, every client's.
	maxClients = 4096
)

// bucket is a token bucket; the zero value is full.
type bucket struct {
	used   bool
	tokens float64
	last   time.Time
}

// take takes a token at now from a bucket of burst tokens refilled one
// every every, or tells how long until the next.
func (b *bucket) take(now time.Time, burst float64, every time.Duration) (bool, time.Duration) {
	b.refill(now, burst, every)
	if b.tokens < 1 {
		return false, time.Duration((1 - b.tokens) * float64(every))
	}
	b.tokens--
	return true, 0
}

func (b *bucket) refill(now time.Time, burst float64, every time.Duration) {
	if !b.used {
		b.used, b.tokens, b.last = true, burst, now
	}
	if now.After(b.last) {
		b.tokens = min(burst, b.tokens+float64(now.Sub(b.last))/float64(every))
		b.last = now
	}
}

// allow takes an attempt of client at now, or tells how long until the
// next: the client's own bucket first, then everyone's.
func (l *loginLimiter) allow(client string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clients == nil {
		l.clients = map[string]*bucket{}
	}
	b := l.clients[client]
	if b == nil {
		if len(l.clients) >= maxClients {
			for k, o := range l.clients {
				if o.refill(now, loginBurst, loginEvery); o.tokens >= loginBurst {
					delete(l.clients, k)
				}
			}
			if len(l.clients) >= maxClients {
				clear(l.clients)
			}
		}
		b = &bucket{}
		l.clients[client] = b
	}
	if ok, wait := b.take(now, loginBurst, loginEvery); !ok {
		return false, wait
	}
	return l.global.take(now, globalBurst, globalEvery)
}

// clientOf is the address a request came from, without its port.
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// write wraps a POST handler: the CSRF token must match the cookie, and off
// loopback the session must hold the admin token.
func (c *Console) write(h func(w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ck, err := r.Cookie(csrfCookie)
		if err != nil || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(r.PostFormValue("csrf"))) != 1 {
			http.Error(w, "the form's CSRF token does not match: reload the page and try again", http.StatusForbidden)
			return
		}
		if !c.cfg.Loopback && !c.session(r) {
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		h(w, r)
	}
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, "login", "Sign in", nil)
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(r.PostFormValue("csrf"))) != 1 {
		http.Error(w, "the form's CSRF token does not match: reload the page and try again", http.StatusForbidden)
		return
	}
	if ok, wait := c.logins.allow(clientOf(r), c.cfg.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
		http.Error(w, "too many sign-in attempts: wait and try again", http.StatusTooManyRequests)
		return
	}
	if c.cfg.Token == "" || subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), []byte(c.cfg.Token)) != 1 {
		c.render(w, r, "login", "Sign in", errors.New("that is not the admin token"))
		return
	}
	exp := strconv.FormatInt(c.cfg.Now().Add(12*time.Hour).Unix(), 10)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: exp + "." + c.sign("session:"+exp), Path: "/", HttpOnly: true, Secure: c.cfg.SecureCookies, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// --- helpers ---

// preview shows at most 200 characters of b as text, or its size when it
// is not UTF-8.
func preview(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes of binary)", len(b))
	}
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

func humanDuration(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		s = "now"
		return s
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh", int(d.Hours()))
	default:
		s = fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	if neg {
		return s + " ago"
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}
