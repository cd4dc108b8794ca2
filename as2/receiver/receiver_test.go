package receiver_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/as2/as2test"
	"github.com/idemgo/idem/as2/receiver"
	"github.com/idemgo/idem/store/memstore"
)

const x12 = "ISA*00*          *00*          *ZZ*BUYER          *ZZ*SUPPLIER       *260514*1032*^*00501*000000905*0*P*:~" +
	"GS*PO*BUYER*SUPPLIER*20260514*1032*905*X*005010~ST*850*0001~BEG*00*SA*ORD-1**20260514~SE*3*0001~GE*1*905~IEA*1*000000905~"

// profiles writes the two sides' certificates and profile files and loads
// them: the sender (BUYER) and the receiver (SUPPLIER), signing with
// SHA-256, encrypting with AES-256-CBC, asking for a signed synchronous MDN.
func profiles(t *testing.T, receiverURL string) (buyer, supplier *as2.Profile) {
	dir := t.TempDir()
	as2test.NewParty(t, dir, "buyer", 1)
	as2test.NewParty(t, dir, "supplier", 2)
	write := func(name, us, cert, key, them, themCert string) *as2.Profile {
		path := filepath.Join(dir, name)
		yaml := fmt.Sprintf("as2_id: %s\ncertificate: %s\nprivate_key: %s\npartners:\n  - as2_id: %s\n    url: %s\n    certificate: %s\n    sign: sha256\n    encrypt: aes256-cbc\n    mdn: sync\n    mdn_sign: sha256\n    edi_senders: [%s]\n",
			us, cert, key, them, receiverURL, themCert, them)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := as2.LoadProfile(path, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("buyer.yaml", "BUYER", "buyer.pem", "buyer.key", "SUPPLIER", "supplier.pem"),
		write("supplier.yaml", "SUPPLIER", "supplier.pem", "supplier.key", "BUYER", "buyer.pem")
}

// endpoint runs a receiver for supplier and records what it delivers and
// rejects; fail, if set, decides the outcome of each delivery.
type endpoint struct {
	srv       *httptest.Server
	rv        *receiver.Receiver
	mu        sync.Mutex
	delivered map[string][][]byte
	rejected  []string
	rejectErr error // what Reject answers, when set
	fail      func(receiver.Delivery) error
}

// newReceiver serves a receiver for supplier on a memory store, with
// Deliver and Reject that accept everything, as set changes them.
func newReceiver(t *testing.T, supplier *as2.Profile, set func(*receiver.Config)) *httptest.Server {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	g, err := idem.NewGuard(idem.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	cfg := receiver.Config{Profile: supplier, Guard: g, Logger: slog.New(slog.DiscardHandler),
		Deliver: func(context.Context, receiver.Delivery) error { return nil },
		Reject:  func(context.Context, http.Header, []byte, *as2.Failure) error { return nil }}
	set(&cfg)
	rv, err := receiver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rv)
	t.Cleanup(srv.Close)
	return srv
}

func newEndpoint(t *testing.T, supplier *as2.Profile, maxBytes int64) *endpoint {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	g, err := idem.NewGuard(idem.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	e := &endpoint{delivered: map[string][][]byte{}}
	rv, err := receiver.New(receiver.Config{Profile: supplier, Guard: g, MaxBytes: maxBytes, Logger: slog.New(slog.DiscardHandler),
		Deliver: func(_ context.Context, d receiver.Delivery) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.fail != nil {
				if err := e.fail(d); err != nil {
					return err
				}
			}
			e.delivered[d.Key] = append(e.delivered[d.Key], d.Data)
			return nil
		},
		Reject: func(_ context.Context, h http.Header, body []byte, why *as2.Failure) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.rejectErr != nil {
				return e.rejectErr
			}
			e.rejected = append(e.rejected, why.Modifier)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	e.rv = rv
	e.srv = httptest.NewServer(rv)
	t.Cleanup(e.srv.Close)
	return e
}

func post(t *testing.T, url string, out *as2.Outgoing) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(out.Body))
	req.Header = out.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// receipt posts out and checks the MDN acknowledges it.
func receipt(t *testing.T, e *endpoint, buyer *as2.Profile, out *as2.Outgoing, id string) (*as2.MDN, []byte) {
	t.Helper()
	status, h, body := post(t, e.srv.URL, out)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	m, err := as2.ParseMDN(h, body, buyer.Partners["SUPPLIER"])
	if err != nil {
		t.Fatalf("MDN: %v (%s)", err, body)
	}
	return m, body
}

func TestDeliversEachInterchangeOnce(t *testing.T) {
	buyer, supplier := profiles(t, "http://unused")
	e := newEndpoint(t, supplier, 0)
	partner := buyer.Partners["SUPPLIER"]
	pack := func(id, payload string) *as2.Outgoing {
		out, err := buyer.Pack(partner, id, "application/edi-x12", []byte(payload), "Mon, 30 Nov 2026 08:00:00 GMT")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	first := pack("m1@buyer", x12)
	m1, body1 := receipt(t, e, buyer, first, "m1@buyer")
	if err := first.Check(m1, "m1@buyer", partner); err != nil {
		t.Fatal(err)
	}
	// The same message again (re-signed, re-encrypted: other bytes): the
	// same MDN, nothing delivered again.
	again := pack("m1@buyer", x12)
	m2, body2 := receipt(t, e, buyer, again, "m1@buyer")
	if !bytes.Equal(body1, body2) {
		t.Fatal("a duplicate got another MDN")
	}
	if err := again.Check(m2, "m1@buyer", partner); err != nil {
		t.Fatal(err)
	}
	// The same interchange under a new Message-ID: a duplicate too.
	retransmitted := pack("m2@buyer", x12)
	m3, _ := receipt(t, e, buyer, retransmitted, "m2@buyer")
	if err := retransmitted.Check(m3, "m2@buyer", partner); err != nil {
		t.Fatal(err)
	}
	// The same control reference with other content: an error MDN.
	reused := pack("m3@buyer", strings.Replace(x12, "ORD-1", "ORD-2", 1))
	m4, _ := receipt(t, e, buyer, reused, "m3@buyer")
	if m4.Processed() || !strings.Contains(m4.Modifier(), as2.UnexpectedProcessingError) {
		t.Fatalf("a reused control reference: %q", m4.Disposition)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.delivered) != 1 {
		t.Fatalf("delivered %d interchanges, want 1", len(e.delivered))
	}
	for k, copies := range e.delivered {
		if len(copies) != 1 || string(copies[0]) != x12 {
			t.Fatalf("interchange %s delivered %d times: %q", k, len(copies), copies)
		}
	}
}

// TestRefusedMessagesOfPartnersAreKept: a partner's authenticated message
// that is refused (its control reference reused with other content) is
// kept through Reject and answered with an error MDN; when it cannot be
// kept, it is answered 503 and its retransmission is refused and kept.
func TestRefusedMessagesOfPartnersAreKept(t *testing.T) {
	buyer, supplier := profiles(t, "http://unused")
	e := newEndpoint(t, supplier, 0)
	pack := func(id, payload string) *as2.Outgoing {
		out, err := buyer.Pack(buyer.Partners["SUPPLIER"], id, "application/edi-x12", []byte(payload), "Mon, 30 Nov 2026 08:00:00 GMT")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	receipt(t, e, buyer, pack("first@buyer", x12), "first@buyer")
	e.mu.Lock()
	e.rejectErr = errors.New("the rejected directory is full")
	e.mu.Unlock()
	reused := pack("reused@buyer", strings.Replace(x12, "ORD-1", "ORD-2", 1))
	if status, _, body := post(t, e.srv.URL, reused); status != http.StatusServiceUnavailable {
		t.Fatalf("a refusal that cannot be kept: %d %s", status, body)
	}
	e.mu.Lock()
	e.rejectErr = nil
	e.mu.Unlock()
	m, _ := receipt(t, e, buyer, reused, "reused@buyer")
	if m.Processed() || !strings.Contains(m.Modifier(), as2.UnexpectedProcessingError) {
		t.Fatalf("a reused control reference: %q", m.Disposition)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.rejected) != 1 || e.rejected[0] != as2.UnexpectedProcessingError {
		t.Fatalf("rejected %v", e.rejected)
	}
}

func TestTooLargeBeforeDecryption(t *testing.T) {
	buyer, supplier := profiles(t, "http://unused")
	e := newEndpoint(t, supplier, 1024)
	out, _ := buyer.Pack(buyer.Partners["SUPPLIER"], "big@buyer", "application/edi-x12", bytes.Repeat([]byte("x"), 4096), "Mon, 30 Nov 2026 08:00:00 GMT")
	if status, _, _ := post(t, e.srv.URL, out); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", status)
	}
}

func TestTransientDeliveryFailureIsRetried(t *testing.T) {
	buyer, supplier := profiles(t, "http://unused")
	e := newEndpoint(t, supplier, 0)
	calls := 0
	e.fail = func(receiver.Delivery) error {
		if calls++; calls == 1 {
			return errors.New("disk full")
		}
		return nil
	}
	out, _ := buyer.Pack(buyer.Partners["SUPPLIER"], "retry@buyer", "application/edi-x12", []byte(x12), "Mon, 30 Nov 2026 08:00:00 GMT")
	if status, _, body := post(t, e.srv.URL, out); status != http.StatusServiceUnavailable {
		t.Fatalf("first attempt: %d %s, want 503", status, body)
	}
	m, _ := receipt(t, e, buyer, out, "retry@buyer")
	if err := out.Check(m, "retry@buyer", buyer.Partners["SUPPLIER"]); err != nil {
		t.Fatal(err)
	}
	if calls != 2 || len(e.delivered) != 1 {
		t.Fatalf("%d delivery calls, %d delivered", calls, len(e.delivered))
	}
}
