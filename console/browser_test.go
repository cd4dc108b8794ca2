package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/console"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/httpsender"
	"github.com/idemgo/idem/store"
)

// chromiumPath finds Debian's chromium (.ci/run installs it); without it
// the browser test skips, or fails under IDEM_TEST_REQUIRE=1.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Need(t, "chromium (Debian's package: apt-get install chromium; .ci/run installs it)", "PATH", errors.New("not found"))
	return ""
}

// TestInABrowser drives the console in headless Chromium, on SQLite and on
// MariaDB (records, outbox and inbox in one database): a message to a
// destination that answers 400 is dead; the Outbox page shows it with its
// last error; Retry makes it pending; a key is forgotten from the Keys page
// through its confirmation; no page logs a JavaScript error or a CSP
// violation. On failure a screenshot is saved in the test's directory.
// IDEM_CONSOLE_SCREENSHOT=FILE also saves the overview there (the README's
// picture).
func TestInABrowser(t *testing.T) {
	for _, kind := range []string{"sqlite", "mysql"} {
		t.Run(kind, func(t *testing.T) { inABrowser(t, kind) })
	}
}

func inABrowser(t *testing.T, kind string) {
	exe := chromiumPath(t)
	// The relay's sends of the last few minutes, for the overview's chart.
	hist := console.NewHistory(nil)
	for i := range 240 {
		hist.Add([]string{"acked", "acked", "acked", "sent", "pending", "dead"}[i%6])
	}
	f := newFixtureOn(t, console.Config{Loopback: true, History: hist, HistoryTitle: "Sends"}, kind)
	ctx := context.Background()

	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "invoice INV-1 refused: unknown customer", http.StatusBadRequest)
	}))
	defer refusing.Close()
	if err := f.outbox.Enqueue(ctx, outbox.Message{Key: "INV-1", Destination: refusing.URL + "/invoices", Payload: []byte(`{"invoice":"INV-1","amount_cents":1200}`),
		Headers: map[string]string{"Content-Type": "application/json"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		_ = f.outbox.Enqueue(ctx, outbox.Message{Key: "INV-" + string(rune('2'+i)), Destination: "https://billing.example/invoices", Payload: []byte(`{}`)})
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Store: f.outbox, Sender: httpsender.New(httpsender.Config{Timeout: 5 * time.Second})})
	if err != nil {
		t.Fatal(err)
	}
	relay.RunOnce(ctx)
	if row, _ := f.outbox.Get(ctx, "INV-1"); row.Status != outbox.Dead {
		t.Fatalf("the refused message is %s, want dead (%s)", row.Status, row.LastError)
	}
	for _, id := range []string{"ORD-7", "ORD-8"} {
		key := idem.Key{Scope: "orders", ID: id}.Storage(false)
		a, err := f.store.Acquire(ctx, store.AcquireRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if id == "ORD-7" {
			_ = f.store.Complete(ctx, key, a.Fence, []byte(`{"order":"ORD-7","status":"booked"}`), time.Hour)
		}
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Headless,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true), chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()

	var mu sync.Mutex
	var pageErrors []string
	if err := chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			pageErrors = append(pageErrors, "exception: "+e.ExceptionDetails.Text)
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				pageErrors = append(pageErrors, "console.error")
			}
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError {
				pageErrors = append(pageErrors, "log: "+e.Entry.Text)
			}
		}
	}); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	// The first call starts the browser on bctx (no timeout there: it would
	// end the browser); each step then gets its own.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	screenshot := func(name string) string {
		sctx, cancel := context.WithTimeout(bctx, 10*time.Second)
		defer cancel()
		buf, err := chromedp.Run(sctx, chromedp.FullScreenshot(90))
		if err != nil {
			return "(no screenshot: " + err.Error() + ")"
		}
		path := filepath.Join(t.TempDir(), name)
		_ = os.WriteFile(path, buf, 0o644)
		return path
	}
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			t.Fatalf("%s: %v (screenshot: %s)", what, err, screenshot("failure.png"))
		}
	}
	text := func(sel string) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 20*time.Second)
		defer cancel()
		v, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
		// A node found just as its document is replaced (the page a form's
		// redirect leads to, updated once more as it loads) is gone by the
		// time it is read: the read asks for the node again (CI, once in
		// "reading .flash").
		for try := 0; err != nil && strings.Contains(err.Error(), "No node with given id found") && try < 3; try++ {
			v, err = chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
		}
		if err != nil {
			t.Fatalf("reading %s: %v (screenshot: %s)", sel, err, screenshot("failure.png"))
		}
		return v
	}
	base := f.srv.URL

	// The dead message, its last error, and Retry.
	step("open the dead messages", chromedp.Navigate(base+"/outbox?status=dead"), chromedp.WaitVisible(chromedp.CSS(`td.error-text`)))
	if rowText := text(`table.rows tbody`); !strings.Contains(rowText, "INV-1") || !strings.Contains(rowText, "400") {
		t.Fatalf("the Outbox page shows %q, want INV-1 and its 400 (screenshot: %s)", rowText, screenshot("failure.png"))
	}
	step("retry it", chromedp.Click(chromedp.CSS(`form[action="/outbox/retry"] button`)), chromedp.WaitVisible(chromedp.CSS(`.flash`)))
	flash := text(`.flash`)
	step("open the message", chromedp.Navigate(base+"/outbox/row?key=INV-1"), chromedp.WaitVisible(chromedp.CSS(`dl.facts`)))
	if status := text(`dl.facts .status`); !strings.Contains(flash, "retrying INV-1") || status != "pending" {
		t.Fatalf("after Retry: flash %q, status %q (screenshot: %s)", flash, status, screenshot("failure.png"))
	}
	if row, _ := f.outbox.Get(ctx, "INV-1"); row.Status != outbox.Pending {
		t.Fatalf("the outbox says %s after Retry", row.Status)
	}

	// Forget a key from the Keys page, through its confirmation.
	step("forget a key", chromedp.Navigate(base+"/keys?scope=orders&prefix=ORD-7"),
		chromedp.WaitVisible(chromedp.CSS(`form[action="/keys/forget"] button`)),
		chromedp.Click(chromedp.CSS(`form[action="/keys/forget"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`button.danger`)))
	question := text(`main`)
	step("confirm", chromedp.Click(chromedp.CSS(`button.danger`)), chromedp.WaitVisible(chromedp.CSS(`.flash`)))
	if flash := text(`.flash`); !strings.Contains(question, "orders/ORD-7") || !strings.Contains(flash, "forgot orders/ORD-7") {
		t.Fatalf("forget: question %q, flash %q (screenshot: %s)", question, flash, screenshot("failure.png"))
	}
	if _, err := f.store.Get(ctx, idem.Key{Scope: "orders", ID: "ORD-7"}.Storage(false)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the key is still in the store: %v", err)
	}

	// The overview, with its live refresh running once (the page's own
	// five-second timer).
	step("the overview", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`table.counts`)), chromedp.Sleep(6*time.Second))
	if counts := text(`main`); !strings.Contains(counts, "pending") || !strings.Contains(counts, "in-flight") {
		t.Fatalf("the overview shows %q", counts)
	}
	if out := os.Getenv("IDEM_CONSOLE_SCREENSHOT"); out != "" {
		step("the overview for the picture", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`svg.chart`)))
		sctx, cancel := context.WithTimeout(bctx, 10*time.Second)
		buf, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(pageErrors) > 0 {
		t.Fatalf("the pages logged errors: %q (screenshot: %s)", pageErrors, screenshot("failure.png"))
	}
}
