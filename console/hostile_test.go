package console_test

import (
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/console"
)

// TestLoopbackAnswersLoopbackNamesOnly: a page that rebinds its own name to
// 127.0.0.1 reaches the loopback console with Host: rebind.attacker.example;
// it gets no page (and so no CSRF token) and cannot write. Loopback names,
// with or without a port, and names given in AllowedHosts are served.
func TestLoopbackAnswersLoopbackNamesOnly(t *testing.T) {
	f := newFixture(t, console.Config{Loopback: true, AllowedHosts: []string{"console.internal"}})
	port := f.srv.URL[strings.LastIndex(f.srv.URL, ":"):]
	for host, want := range map[string]int{
		"rebind.attacker.example":        http.StatusMisdirectedRequest,
		"rebind.attacker.example" + port: http.StatusMisdirectedRequest,
		"127.0.0.1" + port:               http.StatusOK,
		"localhost" + port:               http.StatusOK,
		"[::1]" + port:                   http.StatusOK,
		"console.internal" + port:        http.StatusOK,
	} {
		for _, method := range []string{"GET", "POST"} {
			req, _ := http.NewRequest(method, f.srv.URL+"/", nil)
			if method == "POST" {
				req, _ = http.NewRequest(method, f.srv.URL+"/keys/forget", strings.NewReader("scope=s&id=i"))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			req.Host = host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if method == "GET" && resp.StatusCode != want {
				t.Errorf("GET with Host %s: %d, want %d", host, resp.StatusCode, want)
			}
			if want != http.StatusOK && (resp.StatusCode != want || strings.Contains(string(body), "csrf")) {
				t.Errorf("%s with Host %s: %d %.100s", method, host, resp.StatusCode, body)
			}
		}
	}
}

// TestOffLoopbackEveryPageNeedsTheToken: off loopback, reading keys,
// outbox rows and search results needs a session signed in with the admin
// token, not only writing; the sign-in page stays open.
func TestOffLoopbackEveryPageNeedsTheToken(t *testing.T) {
	f := newFixture(t, console.Config{Token: "s3cret"})
	for _, path := range []string{"/", "/keys", "/outbox", "/outbox/row?key=k", "/find?q=k"} {
		resp, err := noRedirects.Get(f.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
			t.Errorf("GET %s without signing in: %d %s", path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	tok := csrfOf(t, f.get(t, "/login"))
	f.post(t, "/login", url.Values{"token": {"s3cret"}, "csrf": {tok}})
	if page := f.get(t, "/keys"); !strings.Contains(page, "Keys") {
		t.Fatalf("signed in, /keys: %.200s", page)
	}
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// TestLoginIsRateLimited: wrong tokens are answered 429 with Retry-After
// after the first few, whatever the token, until time passes (an injected
// clock); the right token then signs in.
func TestLoginIsRateLimited(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	f := newFixture(t, console.Config{Token: "s3cret", Now: func() time.Time { return now }})
	tok := csrfOf(t, f.get(t, "/login"))
	limited := 0
	for range 20 {
		if code, _ := f.post(t, "/login", url.Values{"token": {"wrong"}, "csrf": {tok}}); code == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited < 14 {
		t.Fatalf("%d of 20 wrong tokens limited", limited)
	}
	if code, _ := f.post(t, "/login", url.Values{"token": {"s3cret"}, "csrf": {tok}}); code != http.StatusTooManyRequests {
		t.Fatalf("the right token while limited: %d", code)
	}
	now = now.Add(time.Minute)
	if code, body := f.post(t, "/login", url.Values{"token": {"s3cret"}, "csrf": {tok}}); code != http.StatusOK || strings.Contains(body, "not the admin token") {
		t.Fatalf("a minute later: %d", code)
	}
}

// TestSecureCookies: with SecureCookies (the listener serves TLS), the
// session and CSRF cookies are Secure.
func TestSecureCookies(t *testing.T) {
	f := newFixture(t, console.Config{Token: "s3cret", SecureCookies: true})
	resp, err := f.client.Get(f.srv.URL + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if !c.Secure {
			t.Errorf("cookie %s is not Secure", c.Name)
		}
	}
	if len(resp.Cookies()) == 0 {
		t.Fatal("no cookies")
	}
}

// TestLoginLimitIsPerClient: a stranger trying a wrong token every second
// is limited on its own: the operator, from another address, signs in
// with the right token at once.
func TestLoginLimitIsPerClient(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	f := newFixture(t, console.Config{Token: "s3cret", Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	jar, _ := cookiejar.New(nil)
	stranger := &fixture{srv: f.srv, client: &http.Client{Jar: jar, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}}
	strangerTok := csrfOf(t, stranger.get(t, "/login"))
	operatorTok := csrfOf(t, f.get(t, "/login"))
	limited := 0
	for range 60 {
		if code, _ := stranger.post(t, "/login", url.Values{"token": {"wrong"}, "csrf": {strangerTok}}); code == http.StatusTooManyRequests {
			limited++
		}
		mu.Lock()
		now = now.Add(time.Second)
		mu.Unlock()
	}
	if limited < 40 {
		t.Fatalf("the stranger was limited %d times in 60 tries a second apart", limited)
	}
	for try := range 3 {
		if code, body := f.post(t, "/login", url.Values{"token": {"s3cret"}, "csrf": {operatorTok}}); code != http.StatusOK || strings.Contains(body, "not the admin token") {
			t.Fatalf("the operator's try %d with the right token: %d", try+1, code)
		}
	}
}

// TestLoopbackHostRefusesOtherSpellings: the Host allow-list of a loopback
// listener answers to localhost and loopback addresses as written, and to
// nothing else — not another name (DNS rebinding), not a trailing dot,
// not the octal, hex, decimal or short forms of 127.0.0.1, not an empty
// Host.
func TestLoopbackHostRefusesOtherSpellings(t *testing.T) {
	for _, h := range []string{"localhost", "localhost:8080", "LOCALHOST", "127.0.0.1", "127.0.0.1:9090", "127.0.0.2", "[::1]", "[::1]:9090", "::1", "ops.internal"} {
		if !console.LoopbackHost(h, []string{"ops.internal"}) {
			t.Errorf("%q refused", h)
		}
	}
	for _, h := range []string{"", "attacker.example", "attacker.example:8080", "localhost.", "localhost.:8080", "127.0.0.1.", "127.1", "127.1:8080",
		"0177.0.0.1", "0x7f.0.0.1", "0x7f000001", "2130706433", "017700000001", "127.000.000.001", "localhost.attacker.example",
		"127.0.0.1.nip.io", "[::ffff:8.8.8.8]", "ops.internal.", "0.0.0.0", "[::]"} {
		if console.LoopbackHost(h, []string{"ops.internal"}) {
			t.Errorf("%q answered to", h)
		}
	}
}
