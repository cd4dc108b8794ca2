package console_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/console"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/mysqlstore"
)

const hostile = `<script>alert(1)</script>`

// fixture is a console over a memory store, a SQLite outbox and inbox.
type fixture struct {
	db     *sql.DB
	store  store.Store
	outbox *outbox.Store
	inbox  *inbox.Inbox[*sql.Tx]
	srv    *httptest.Server
	client *http.Client
}

// newFixture serves a console over a memory store and an outbox and inbox
// in SQLite.
func newFixture(t *testing.T, cfg console.Config) *fixture { return newFixtureOn(t, cfg, "sqlite") }

// newFixtureOn is newFixture on a database of the kind: sqlite, or mysql
// (the records, the outbox and the inbox in a MariaDB database of the
// test's own).
func newFixtureOn(t *testing.T, cfg console.Config, kind string) *fixture {
	t.Helper()
	ctx := context.Background()
	var db *sql.DB
	var dialect sqldriver.Dialect
	var s store.Store
	if kind == "mysql" {
		loc := testenv.MySQLDatabase(t, "")
		db, dialect = testenv.OpenMySQL(t, loc), sqldriver.MySQL
		ms, err := mysqlstore.Open(ctx, mysqlstore.Config{DSN: loc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ms.Close() })
		s = ms
	} else {
		var err error
		db, err = sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "app.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { db.Close() })
		ms := memstore.New(memstore.Config{})
		t.Cleanup(func() { ms.Close() })
		dialect, s = sqldriver.SQLite, ms
	}
	ob, err := outbox.New(databasesql.New(db, dialect), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(databasesql.New(db, dialect), inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Outbox, cfg.Inbox = s, ob.Store, ib
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return &fixture{db: db, store: s, outbox: ob.Store, inbox: ib, srv: srv, client: &http.Client{Jar: jar}}
}

func (f *fixture) get(t *testing.T, path string) string {
	t.Helper()
	resp, err := f.client.Get(f.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

func (f *fixture) post(t *testing.T, path string, form url.Values) (int, string) {
	t.Helper()
	resp, err := f.client.PostForm(f.srv.URL+path, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

func csrfOf(t *testing.T, html string) string {
	m := csrfField.FindStringSubmatch(html)
	if m == nil {
		t.Fatalf("no CSRF token in the page")
	}
	return m[1]
}

// TestEverythingIsEscaped: keys, payloads, errors and headers are
// attacker-controlled; each renders as text.
func TestEverythingIsEscaped(t *testing.T) {
	f := newFixture(t, console.Config{Loopback: true})
	ctx := context.Background()
	key := idem.Key{Scope: "web", ID: hostile}.Storage(false)
	a, err := f.store.Acquire(ctx, store.AcquireRequest{Key: key, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Complete(ctx, key, a.Fence, []byte(hostile), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := f.outbox.Enqueue(ctx, outbox.Message{Key: "k-" + hostile[:7], Destination: "https://x.example/" + hostile,
		Payload: []byte(hostile), Headers: map[string]string{"X-Evil": hostile}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.inbox.Process(ctx, inbox.Event{Consumer: hostile, CorrelationID: "web/" + hostile}, func(context.Context, *sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/", "/keys", "/outbox", "/outbox/row?key=" + url.QueryEscape("k-"+hostile[:7]), "/find?q=" + url.QueryEscape("web/"+hostile)} {
		page := f.get(t, path)
		if strings.Contains(page, "<script>alert") {
			t.Fatalf("%s renders the hostile text as markup", path)
		}
		if path != "/" && !strings.Contains(page, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Fatalf("%s does not show the hostile text escaped", path)
		}
	}
}

// TestWritesNeedCSRFAndTheToken: a POST without the form's token is
// refused; off loopback a POST needs a session signed in with the admin
// token, and a wrong token signs nobody in.
func TestWritesNeedCSRFAndTheToken(t *testing.T) {
	f := newFixture(t, console.Config{Token: "s3cret"})
	ctx := context.Background()
	if err := f.outbox.Enqueue(ctx, outbox.Message{Key: "dead-1", Destination: "https://x.example/", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	page := f.get(t, "/outbox")
	tok := csrfOf(t, f.get(t, "/login"))
	_ = page
	if code, _ := f.post(t, "/outbox/retry", url.Values{"key": {"dead-1"}}); code != http.StatusForbidden {
		t.Fatalf("a POST without the CSRF token: %d", code)
	}
	if code, _ := f.post(t, "/outbox/retry", url.Values{"key": {"dead-1"}, "csrf": {strings.Repeat("0", 64)}}); code != http.StatusForbidden {
		t.Fatalf("a POST with another CSRF token: %d", code)
	}
	// With the right CSRF token but no session: sent to sign in.
	_, body := f.post(t, "/outbox/retry", url.Values{"key": {"dead-1"}, "csrf": {tok}})
	if !strings.Contains(body, "Admin token") {
		t.Fatal("a write without a session was not sent to sign in")
	}
	if _, body := f.post(t, "/login", url.Values{"token": {"wrong"}, "csrf": {tok}}); !strings.Contains(body, "not the admin token") {
		t.Fatal("a wrong token signed in")
	}
	if code, _ := f.post(t, "/login", url.Values{"token": {"s3cret"}, "csrf": {tok}}); code != http.StatusOK {
		t.Fatalf("sign in: %d", code)
	}
	// Signed in: a retry of a row that is not dead reaches the outbox,
	// which says so.
	if _, body := f.post(t, "/outbox/retry", url.Values{"key": {"dead-1"}, "csrf": {tok}}); !strings.Contains(body, "no message with that key among the dead messages") {
		t.Fatalf("signed in, the retry did not reach the outbox: %.200s", body)
	}
	if _, err := console.New(console.Config{}); err == nil {
		t.Fatal("a console off loopback without a token was accepted")
	}
}

func TestKeysPagesAndFilters(t *testing.T) {
	f := newFixture(t, console.Config{Loopback: true, PageSize: 10})
	ctx := context.Background()
	for i := range 35 {
		for _, scope := range []string{"orders", "payments"} {
			key := idem.Key{Scope: scope, ID: "K-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)}.Storage(false)
			a, err := f.store.Acquire(ctx, store.AcquireRequest{Key: key, Lease: time.Minute, Retention: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if i%5 == 0 {
				_ = f.store.Complete(ctx, key, a.Fence, []byte("ok"), time.Hour)
			}
		}
	}
	seen, next := 0, "/keys?scope=payments"
	for next != "" {
		page := f.get(t, next)
		if strings.Contains(page, "orders/") {
			t.Fatal("the scope filter let another scope through")
		}
		seen += strings.Count(page, `class="key"><a href="/find?q=payments`)
		m := regexp.MustCompile(`class="next" href="([^"]+)"`).FindStringSubmatch(page)
		next = ""
		if m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if seen != 35 {
		t.Fatalf("paged through %d payments keys, want 35", seen)
	}
	if page := f.get(t, "/keys?state=completed"); strings.Count(page, `class="state completed"`) != 10 {
		t.Fatalf("the state filter shows %d completed keys, want 10", strings.Count(page, `class="state completed"`))
	}
}

// TestHistoryChart: the overview draws the process's outcomes per minute
// over the last hour; an outcome older than an hour is gone.
func TestHistoryChart(t *testing.T) {
	now := time.Date(2026, 11, 30, 9, 0, 30, 0, time.UTC)
	clock := func() time.Time { return now }
	h := console.NewHistory(clock)
	for range 7 {
		h.Add("executed")
	}
	h.Add("replayed")
	now = now.Add(2 * time.Minute)
	h.Add("mismatch")
	minutes, names := h.LastHour()
	if len(minutes) != 60 || strings.Join(names, ",") != "executed,mismatch,replayed" {
		t.Fatalf("%d minutes, outcomes %v", len(minutes), names)
	}
	if got := minutes[57].Counts["executed"]; got != 7 {
		t.Fatalf("the minute two minutes ago has %d executed, want 7", got)
	}
	if got := minutes[59].Counts["mismatch"]; got != 1 {
		t.Fatalf("this minute has %d mismatches, want 1", got)
	}
	f := newFixture(t, console.Config{Loopback: true, History: h, HistoryTitle: "Requests"})
	page := f.get(t, "/")
	for _, want := range []string{"<svg", "Requests, last hour, per minute (9 in all)", "executed 7", "replayed 1", "mismatch 1"} {
		if !strings.Contains(page, want) {
			t.Fatalf("the overview lacks %q", want)
		}
	}
	now = now.Add(61 * time.Minute)
	if minutes, _ := h.LastHour(); minutes[0].Counts["executed"]+minutes[59].Counts["mismatch"] != 0 {
		t.Fatal("outcomes older than an hour are still counted")
	}
}

// TestChartTellsSentFromAcked: a relay's chart shows sent rows (delivered,
// their receipt still to come) in another colour than acked ones.
func TestChartTellsSentFromAcked(t *testing.T) {
	h := console.NewHistory(time.Now)
	for _, o := range []string{"acked", "sent", "dead", "pending"} {
		h.Add(o)
	}
	f := newFixture(t, console.Config{Loopback: true, History: h, HistoryTitle: "Sends"})
	page := f.get(t, "/")
	class := map[string]string{}
	for _, m := range regexp.MustCompile(`<span class="swatch ([a-z-]+)"></span>([a-z]+) `).FindAllStringSubmatch(page, -1) {
		class[m[2]] = m[1]
	}
	if len(class) != 4 {
		t.Fatalf("legend %v, want four outcomes", class)
	}
	seen := map[string]string{}
	for outcome, c := range class {
		if other, ok := seen[c]; ok {
			t.Fatalf("%s and %s share the colour %s", outcome, other, c)
		}
		seen[c] = outcome
	}
}

// TestMillionRowPages: the Outbox pages of a million-row outbox are keyset
// pages — the page after row 999,950 holds rows 999,951 to 1,000,000, the
// dead rows of a destination are found past half a million others.
func TestMillionRowPages(t *testing.T) {
	if testing.Short() {
		t.Skip("a million rows")
	}
	if raceDetector {
		// Filling a million rows in the pure-Go SQLite under the race
		// detector takes 300 s instead of 8; nothing here is concurrent.
		// .ci/run runs this test without -race.
		t.Skip("a million rows: run without -race (go test -run TestMillionRowPages ./console)")
	}
	f := newFixture(t, console.Config{Loopback: true})
	_, err := f.db.Exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000)
		INSERT INTO idem_outbox (key, destination, payload, status)
		SELECT 'MSG-' || i, CASE WHEN i % 100000 = 0 THEN 'https://rare.example/x' ELSE 'https://bulk.example/x' END, x'7b7d',
			CASE WHEN i % 100000 = 0 THEN 'dead' ELSE 'acked' END FROM n`)
	if err != nil {
		t.Fatal(err)
	}
	page := f.get(t, "/outbox?after=999950")
	if !strings.Contains(page, ">MSG-999951<") || !strings.Contains(page, ">MSG-1000000<") || strings.Contains(page, ">MSG-999950<") {
		t.Fatal("the page after row 999,950 does not hold rows 999,951 to 1,000,000")
	}
	if strings.Contains(page, `class="next"`) {
		t.Fatal("the last page links to a next one")
	}
	page = f.get(t, "/outbox?status=dead&dest="+url.QueryEscape("https://rare.example/"))
	if n := strings.Count(page, `class="status dead"`); n != 10 {
		t.Fatalf("%d dead rows to rare.example, want 10", n)
	}
	first := f.get(t, "/outbox")
	if !strings.Contains(first, ">MSG-1<") || !strings.Contains(first, `href="/outbox?status=&amp;dest=&amp;after=50"`) {
		t.Fatal("the first page does not link to the next by keyset (after=50)")
	}
}

// TestPasswordsInDestinationsAreNotShown: a destination URL may carry a
// password (amqp://USER:PASS@…), and a message's headers credentials
// (Authorization, an API key); every page that shows them shows "xxxxx" in
// their place — and the row still goes where it named, with what it names.
func TestPasswordsInDestinationsAreNotShown(t *testing.T) {
	f := newFixture(t, console.Config{Loopback: true})
	ctx := context.Background()
	dest := "amqp://relay:s3cret-pw@rabbit.example:5672/orders?routing_key=orders"
	if err := f.outbox.Enqueue(ctx, outbox.Message{Key: "ORD-1", Destination: dest, Payload: []byte("p"),
		Headers: map[string]string{"Authorization": "Bearer s3cret-pw", "X-Api-Key": "s3cret-pw", "Content-Type": "application/json"}}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/outbox", "/outbox/row?key=ORD-1", "/find?q=ORD-1"} {
		page := f.get(t, path)
		if strings.Contains(page, "s3cret-pw") {
			t.Fatalf("%s shows the destination's password", path)
		}
		if !strings.Contains(page, "amqp://relay:xxxxx@rabbit.example:5672/orders") {
			t.Fatalf("%s does not show the destination with its password hidden:\n%s", path, page)
		}
	}
	// The row's headers: credentials hidden, the rest shown.
	page := f.get(t, "/outbox/row?key=ORD-1")
	for _, want := range []string{"Authorization: Bearer xxxxx", "X-Api-Key: xxxxx", "Content-Type: application/json"} {
		if !strings.Contains(page, want) {
			t.Fatalf("the row page does not show %q:\n%s", want, page)
		}
	}
	if row, err := f.outbox.Get(ctx, "ORD-1"); err != nil || row.Destination != dest {
		t.Fatalf("the row's destination is %q (%v), want it unchanged", row.Destination, err)
	}
}

// TestStoredResponsesAreShownAsResponses: a record written by the HTTP
// middleware shows as its status, headers and body (JSON pretty-printed)
// on the find page, and as its status and body on the keys page — not as
// bytes of binary.
func TestStoredResponsesAreShownAsResponses(t *testing.T) {
	f := newFixture(t, console.Config{Loopback: true})
	mw, err := httpidem.New(httpidem.Config{Store: f.store, Principal: httpidem.NoPrincipal})
	if err != nil {
		t.Fatal(err)
	}
	api := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1","amount":2500}`)
	}))
	req := httptest.NewRequest("POST", "/charges", strings.NewReader("amount=2500"))
	req.Header.Set("Idempotency-Key", `"order-77"`)
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		t.Fatalf("the request: %d %s", rec.Code, rec.Body)
	}
	keys := f.get(t, "/keys")
	if !strings.Contains(keys, "201 Created · {&#34;id&#34;:&#34;ch_1&#34;") || strings.Contains(keys, "binary") {
		t.Fatalf("the keys page shows the response as %s", keys)
	}
	recs, err := f.store.(store.Lister).List(context.Background(), "", 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("records: %v %v", recs, err)
	}
	found := f.get(t, "/find?q="+url.QueryEscape(recs[0].Key))
	for _, want := range []string{"HTTP 201 Created", "Content-Type: application/json", "{\n  &#34;id&#34;: &#34;ch_1&#34;,\n  &#34;amount&#34;: 2500\n}"} {
		if !strings.Contains(found, want) {
			t.Fatalf("the find page of %q has no %q: %s", recs[0].Key, want, found)
		}
	}
}

// TestMissingTablesSayWhatToRun: a database without idem's tables shows,
// in each panel, which table is missing and what creates it, with the
// store's URL — not the SQL error alone, and not a failed page.
func TestMissingTablesSayWhatToRun(t *testing.T) {
	f := newFixture(t, console.Config{Loopback: true, StoreURL: "sqlite:app.db"})
	if _, err := f.db.Exec(`DROP TABLE idem_outbox; DROP TABLE processed_events`); err != nil {
		t.Fatal(err)
	}
	overview := f.get(t, "/")
	if !strings.Contains(overview, "No idem_outbox table in this database: run idem migrate --store sqlite:app.db to create it.") ||
		!strings.Contains(overview, "Idempotency records") {
		t.Fatalf("the overview: %s", overview)
	}
	if page := f.get(t, "/outbox"); !strings.Contains(page, "run idem migrate --store sqlite:app.db") {
		t.Fatalf("the outbox page: %s", page)
	}
	if page := f.get(t, "/find?q=k"); !strings.Contains(page, "No processed_events table in this database: the transactional inbox creates it") {
		t.Fatalf("the find page: %s", page)
	}
}

// TestBlockedRowsAndSkip: a pending row behind a dead row of its ordering
// key shows as blocked after it; Skip on the dead row (with the form's
// token) makes it skipped, and the row behind it is no longer blocked.
func TestBlockedRowsAndSkip(t *testing.T) {
	f := newFixture(t, console.Config{Loopback: true})
	ctx := context.Background()
	for _, key := range []string{"A-1", "A-2"} {
		if err := f.outbox.Enqueue(ctx, outbox.Message{Key: key, Destination: "https://x.example/", Payload: []byte("p"), OrderingKey: "acct-A"}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: f.outbox, Sender: outbox.SenderFunc(func(context.Context, *outbox.Message) outbox.Result {
		return outbox.Result{Status: outbox.Dead, Err: errors.New("422: refused")}
	})})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("relayed %d (%v), want A-1 alone", n, err)
	}
	page := f.get(t, "/outbox")
	if !strings.Contains(page, `blocked</span> after <a href="/outbox/row?key=A-1">A-1</a>`) || !strings.Contains(page, "acct-A") {
		t.Fatalf("the outbox page does not show A-2 blocked after A-1:\n%s", page)
	}
	if row := f.get(t, "/outbox/row?key=A-2"); !strings.Contains(row, "blocked after the dead message") {
		t.Fatalf("A-2's page does not say it is blocked:\n%s", row)
	}
	code, body := f.post(t, "/outbox/skip", url.Values{"key": {"A-1"}, "csrf": {csrfOf(t, page)}, "back": {"/outbox"}})
	if code != http.StatusOK || !strings.Contains(body, "skipped A-1") {
		t.Fatalf("skip: %d %.300s", code, body)
	}
	if row, _ := f.outbox.Get(ctx, "A-1"); row.Status != outbox.Skipped {
		t.Fatalf("A-1 is %s", row.Status)
	}
	if row, _ := f.outbox.Get(ctx, "A-2"); row.BlockedBy != "" {
		t.Fatalf("A-2 still blocked by %s", row.BlockedBy)
	}
}
