package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemgo/idem/edi"
	"github.com/idemgo/idem/edi/ediout"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/httpsender"
	"github.com/idemgo/idem/outbox/senders"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/sqlitestore"
)

func main() {
	orders := flag.Int("orders", 5, "orders to send")
	dbPath := flag.String("db", "", "SQLite file for the application and its outbox (default: a temporary file)")
	flag.Parse()
	if *dbPath == "" {
		dir, err := os.MkdirTemp("", "edi-orders-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
		*dbPath = filepath.Join(dir, "app.db")
	}
	ok, err := run(context.Background(), os.Stdout, *dbPath, *orders)
	if err != nil {
		fmt.Fprintln(os.Stderr, "edi-orders:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// partner books orders from EDIFACT interchanges.
type partner struct {
	mu       sync.Mutex
	booked   map[string]int    // order number (BGM) → times booked
	attempts map[string]int    // AS2 Message-ID → POSTs seen
	ids      map[string]string // Message-ID → the bytes of the first attempt
	same     bool              // every attempt of a Message-ID carried the same bytes
}

func (p *partner) book(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	ics, err := edi.ReadAll(body)
	if err != nil || len(ics) != 1 || !ics[0].Valid() {
		http.Error(w, "bad interchange", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	for _, m := range ics[0].Messages {
		p.booked[m.Reference]++
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "message/disposition-notification")
	fmt.Fprintf(w, "Original-Message-ID: %s\r\nDisposition: automatic-action/MDN-sent-automatically; processed\r\n", r.Header.Get("Message-ID"))
}

// lossy drops the answer to the first attempt of every Message-ID, after
// the partner processed it.
func (p *partner) lossy(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("Message-ID")
		p.mu.Lock()
		p.attempts[id]++
		first := p.attempts[id] == 1
		if first {
			p.ids[id] = string(body) + "|" + r.Header.Get("Date")
		} else if p.ids[id] != string(body)+"|"+r.Header.Get("Date") {
			p.same = false
		}
		p.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !first {
			next.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close() // the answer is lost on the way back
				return
			}
		}
	})
}

func run(ctx context.Context, out io.Writer, dbPath string, orders int) (bool, error) {
	// The partner, behind idem's Idempotency-Key middleware keyed by the
	// interchange (what `idem serve --key-from edi` does).
	p := &partner{booked: map[string]int{}, attempts: map[string]int{}, ids: map[string]string{}, same: true}
	store := memstore.New(memstore.Config{})
	defer store.Close()
	// The partners' posts carry no credentials here: one scope for all
	// (a real endpoint names the header its callers authenticate with).
	mw, err := httpidem.New(httpidem.Config{Store: store, Principal: httpidem.NoPrincipal,
		KeyFromBody: func(_ *http.Request, body []byte) (string, bool) { return edi.KeyOf(body) }})
	if err != nil {
		return false, err
	}
	srv := httptest.NewServer(p.lossy(mw(http.HandlerFunc(p.book))))
	defer srv.Close()

	// The application and its outbox, one SQLite file.
	db, err := sqlitestore.OpenDB(ctx, dbPath, sqlitestore.DBOptions{BusyTimeout: 10 * time.Second})
	if err != nil {
		return false, err
	}
	defer db.Close()
	ob, err := outbox.New(databasesql.New(db, sqldriver.SQLite), outbox.Config{})
	if err != nil {
		return false, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return false, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (number TEXT PRIMARY KEY, sku TEXT, qty INTEGER)`); err != nil {
		return false, err
	}
	profile := edi.Profile{Standard: edi.EDIFACT, OurID: "5412345678908", OurQualifier: "14", TheirID: "8798765432106", TheirQualifier: "14", LineEnd: "\n"}
	dest := "as2+" + srv.URL + "/as2?from=BUYER&to=SUPPLIER&host=buyer.example"
	fmt.Fprintf(out, "1. The application records %d orders, each with its ORDERS interchange, in one transaction\n", orders)
	var keys []string
	for i := range orders {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		key, err := ob.NextKeyTx(ctx, tx, "ORD", time.Now())
		if err != nil {
			tx.Rollback()
			return false, err
		}
		sku := fmt.Sprintf("SKU-%03d", i+1)
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES (?, ?, ?)`, key, sku, 10+i); err != nil {
			tx.Rollback()
			return false, err
		}
		ctl, err := ediout.EnqueueTx(ctx, ob, tx, profile, key, dest, time.Now(), edi.Document{
			Type: []string{"ORDERS", "D", "96A", "UN"}, Key: key,
			Body: []edi.Segment{edi.E("BGM", "220", "", "9"), {Tag: "LIN", Elements: [][]string{{"1"}, {""}, {sku, "SA"}}},
				{Tag: "QTY", Elements: [][]string{{"21", fmt.Sprint(10 + i)}}}},
		})
		if err != nil {
			tx.Rollback()
			return false, err
		}
		if err := tx.Commit(); err != nil {
			return false, err
		}
		keys = append(keys, key)
		fmt.Fprintf(out, "   %s → interchange %s (UNB 0020), message %s, key in UNH 0068 and BGM\n", key, ctl.Interchange, ctl.Messages[0])
	}

	fmt.Fprintln(out, "2. The relay sends them; the network loses the answer to every first attempt")
	router, closeSenders := senders.New(senders.Config{HTTP: httpsender.Config{Timeout: 5 * time.Second}})
	defer closeSenders()
	var outMu sync.Mutex // OnResult runs on the relay's sending goroutines
	relay, err := outbox.NewRelay(outbox.RelayConfig{Store: ob.Store, Sender: router, BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		OnResult: func(m *outbox.Message, tries int, r outbox.Result) {
			outMu.Lock()
			defer outMu.Unlock()
			fmt.Fprintf(out, "   %s attempt %d: %s %v\n", m.Key, tries, r.Status, errText(r.Err))
		}})
	if err != nil {
		return false, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := relay.RunOnce(ctx); err != nil {
			return false, err
		}
		st, err := ob.Stats(ctx)
		if err != nil {
			return false, err
		}
		if st.Pending == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	fmt.Fprintln(out, "3. What the partner booked")
	p.mu.Lock()
	defer p.mu.Unlock()
	sort.Strings(keys)
	allOK := p.same
	for _, k := range keys {
		row, err := ob.Get(ctx, k)
		if err != nil {
			return false, err
		}
		id := edi.AS2MessageID(k, "buyer.example")
		ok := p.booked[k] == 1 && row.Status == outbox.Acked
		allOK = allOK && ok
		fmt.Fprintf(out, "   %s %s: %d POSTs, booked %d time(s), outbox %s after %d tries\n", mark(ok), k, p.attempts[id], p.booked[k], row.Status, row.Tries)
	}
	if allOK {
		fmt.Fprintf(out, "Every order booked exactly once; every retry carried the same Message-ID, Date and bytes.\n")
	} else {
		fmt.Fprintf(out, "AN ORDER WAS NOT BOOKED EXACTLY ONCE (same bytes on retries: %v).\n", p.same)
	}
	return allOK, nil
}

func mark(ok bool) string {
	if ok {
		return "✓"
	}
	return "✗"
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return "(" + err.Error() + ")"
}
