package as2sender_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/as2/as2test"
	"github.com/idemgo/idem/as2/receiver"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/as2sender"
	"github.com/idemgo/idem/store/memstore"
)

const x12 = "ISA*00*          *00*          *ZZ*BUYER          *ZZ*SUPPLIER       *260514*1032*^*00501*000000905*0*P*:~" +
	"GS*PO*BUYER*SUPPLIER*20260514*1032*905*X*005010~ST*850*0001~BEG*00*SA*ORD-1**20260514~SE*3*0001~GE*1*905~IEA*1*000000905~"

// twoProfiles writes BUYER's and SUPPLIER's profiles: BUYER posts to url
// with agreement (YAML lines of the partner entry).
func twoProfiles(t *testing.T, url, agreement string) (buyer, supplier *as2.Profile) {
	dir := t.TempDir()
	as2test.NewParty(t, dir, "buyer", 1)
	as2test.NewParty(t, dir, "supplier", 2)
	load := func(name, us, them, themURL string) *as2.Profile {
		yaml := fmt.Sprintf("as2_id: %s\ncertificate: %s.pem\nprivate_key: %s.key\nmdn_url: http://127.0.0.1:1/as2/mdn\npartners:\n  - as2_id: %s\n    url: %s\n    certificate: %s.pem\n    edi_senders: [%s]\n%s",
			us, strings.ToLower(us), strings.ToLower(us), them, themURL, strings.ToLower(them), them, agreement)
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := as2.LoadProfile(path, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return load("buyer.yaml", "BUYER", "SUPPLIER", url), load("supplier.yaml", "SUPPLIER", "BUYER", "http://127.0.0.1:1/as2")
}

const signedSync = "    sign: sha256\n    encrypt: aes256-cbc\n    mdn: sync\n    mdn_sign: sha256\n"

// supplierEndpoint is SUPPLIER's receiver; drop, when it returns true for
// an attempt, makes the answer get lost after the message was handled.
func supplierEndpoint(t *testing.T, supplier *as2.Profile, drop func(n int64) bool) (url string, delivered *atomic.Int64) {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	g, _ := idem.NewGuard(idem.Config{Store: s})
	delivered = new(atomic.Int64)
	rv, err := receiver.New(receiver.Config{Profile: supplier, Guard: g,
		Deliver: func(context.Context, receiver.Delivery) error { delivered.Add(1); return nil },
		Reject:  func(context.Context, http.Header, []byte, *as2.Failure) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := attempts.Add(1)
		if drop != nil && drop(n) {
			rv.ServeHTTP(httptest.NewRecorder(), r) // handled, but the answer never arrives
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			conn.Close()
			return
		}
		rv.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/as2", delivered
}

func TestProfileSenderAcksOnAVerifiedMDN(t *testing.T) {
	buyer, supplier := twoProfiles(t, "http://127.0.0.1:1/as2", signedSync)
	url, delivered := supplierEndpoint(t, supplier, func(n int64) bool { return n == 1 })
	buyer.Partners["SUPPLIER"].URL = url
	s := as2sender.NewProfile(buyer, &http.Client{Timeout: 5 * time.Second})
	m := &outbox.Message{Key: "order-1", Destination: "as2://SUPPLIER", Payload: []byte(x12)}
	// The first answer is lost: pending, to be retried.
	if r := s.Send(context.Background(), m); r.Status != outbox.Pending || r.Err == nil {
		t.Fatalf("first attempt: %v %v, want pending", r.Status, r.Err)
	}
	// The retry is a duplicate to the receiver, answered with the same
	// (verified) MDN: acked, and delivered once.
	if r := s.Send(context.Background(), m); r.Status != outbox.Acked {
		t.Fatalf("retry: %v %v, want acked", r.Status, r.Err)
	}
	if delivered.Load() != 1 {
		t.Fatalf("delivered %d times", delivered.Load())
	}
}

// TestProfileSenderRefusesBadReceipts: a receipt for other content (a
// wrong MIC), unsigned where a signed one was asked for, or an error
// disposition is retried; an unknown partner is dead at once.
func TestProfileSenderRefusesBadReceipts(t *testing.T) {
	buyer, supplier := twoProfiles(t, "http://127.0.0.1:1/as2", signedSync)
	mdnFor := func(payload string, failure *as2.Failure, unsigned bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			out, _ := buyer.Pack(buyer.Partners["SUPPLIER"], strings.Trim(r.Header.Get("Message-ID"), "<>"), "application/edi-x12", []byte(payload), r.Header.Get("Date"))
			in, err := supplier.Unpack(out.Header, out.Body)
			if err != nil {
				t.Error(err)
				return
			}
			if unsigned {
				in.MDNSign = 0
			}
			h, body, _ := supplier.BuildMDN(in, failure, time.Now())
			for k, v := range h {
				w.Header()[k] = v
			}
			w.Write(body)
		}
	}
	for _, c := range []struct {
		name    string
		handler http.HandlerFunc
		want    outbox.Status
		errText string
	}{
		{"wrong MIC", mdnFor("other content", nil, false), outbox.Pending, "MIC"},
		{"unsigned", mdnFor(x12, nil, true), outbox.Pending, "not signed"},
		// An error MDN carries no MIC of our bytes: signed or not, it never
		// makes the row dead on its own.
		{"decryption failed", mdnFor(x12, &as2.Failure{Modifier: as2.DecryptionFailed, Err: fmt.Errorf("x")}, false), outbox.Pending, "decryption-failed"},
		// Unsigned where the agreement signs MDNs: anyone could have said
		// it, so it cannot make the row dead.
		{"decryption failed, unsigned", mdnFor(x12, &as2.Failure{Modifier: as2.DecryptionFailed, Err: fmt.Errorf("x")}, true), outbox.Pending, "not signed"},
		{"processing error", mdnFor(x12, &as2.Failure{Modifier: as2.UnexpectedProcessingError, Err: fmt.Errorf("x")}, false), outbox.Pending, "unexpected-processing-error"},
	} {
		srv := httptest.NewServer(c.handler)
		buyer.Partners["SUPPLIER"].URL = srv.URL
		r := as2sender.NewProfile(buyer, nil).Send(context.Background(), &outbox.Message{Key: "k-" + c.name, Destination: "as2://SUPPLIER", Payload: []byte(x12)})
		srv.Close()
		if r.Status != c.want || r.Err == nil || !strings.Contains(r.Err.Error(), c.errText) {
			t.Errorf("%s: %v %v, want %v with %q", c.name, r.Status, r.Err, c.want, c.errText)
		}
	}
	if r := as2sender.NewProfile(buyer, nil).Send(context.Background(), &outbox.Message{Key: "k", Destination: "as2://NOBODY", Payload: []byte(x12)}); r.Status != outbox.Dead {
		t.Fatalf("unknown partner: %v", r.Status)
	}
}

// TestProfileSenderFollowsNoRedirect: a partner's agreed URL answering
// with a redirect does not get the message sent on: the 3xx is the answer,
// recorded, and the redirect's target hears nothing.
func TestProfileSenderFollowsNoRedirect(t *testing.T) {
	var reached atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached.Add(1) }))
	defer other.Close()
	agreed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/admin/reset", http.StatusTemporaryRedirect)
	}))
	defer agreed.Close()
	buyer, _ := twoProfiles(t, agreed.URL, signedSync)
	for _, s := range []outbox.Sender{as2sender.NewProfile(buyer, nil), as2sender.NewProfile(buyer, &http.Client{})} {
		r := s.Send(context.Background(), &outbox.Message{Key: "k", Destination: "as2://SUPPLIER", Payload: []byte(x12)})
		if r.Err == nil || !strings.Contains(r.Err.Error(), "307") {
			t.Errorf("a redirect from the agreed URL: %v %v, want the 307 recorded", r.Status, r.Err)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("the redirect's target got %d requests", n)
	}
}
