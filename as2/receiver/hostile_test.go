package receiver_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/as2/as2test"
	"github.com/idemgo/idem/as2/receiver"
)

const testDate = "Mon, 30 Nov 2026 08:00:00 GMT"

// world is SUPPLIER's receiving profile with partners BUYER and OTHER, and
// their own profiles to send with.
type world struct {
	supplier, buyer, other *as2.Profile
}

// newWorld writes the three parties' certificates and profiles: BUYER and
// OTHER sign with SHA-256 and encrypt with AES-256-CBC, ask for a signed
// synchronous MDN; supplierExtra is appended to each partner entry of
// SUPPLIER's profile (after %s is replaced by the partner's name).
func newWorld(t *testing.T, supplierExtra string) *world {
	t.Helper()
	dir := t.TempDir()
	for i, name := range []string{"buyer", "supplier", "other"} {
		as2test.NewParty(t, dir, name, int64(i+1))
	}
	const agreement = "    sign: sha256\n    encrypt: aes256-cbc\n    mdn: sync\n    mdn_sign: sha256\n"
	load := func(file, yaml string) *as2.Profile {
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := as2.LoadProfile(path, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	partner := func(name string) string {
		return fmt.Sprintf("  - as2_id: %s\n    certificate: %s.pem\n%s%s", name, strings.ToLower(name), agreement, strings.ReplaceAll(supplierExtra, "%s", name))
	}
	sender := func(name string) *as2.Profile {
		lower := strings.ToLower(name)
		return load(lower+".yaml", fmt.Sprintf("as2_id: %s\ncertificate: %s.pem\nprivate_key: %s.key\npartners:\n  - as2_id: SUPPLIER\n    url: http://unused\n    certificate: supplier.pem\n%s", name, lower, lower, agreement))
	}
	return &world{
		supplier: load("supplier.yaml", "as2_id: SUPPLIER\ncertificate: supplier.pem\nprivate_key: supplier.key\npartners:\n"+partner("BUYER")+partner("OTHER")),
		buyer:    sender("BUYER"),
		other:    sender("OTHER"),
	}
}

func (w *world) pack(t *testing.T, from *as2.Profile, id, payload string) *as2.Outgoing {
	t.Helper()
	out, err := from.Pack(from.Partners["SUPPLIER"], id, "application/edi-x12", []byte(payload), testDate)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// unprotected is payload as a message claiming to be from BUYER, neither
// signed nor encrypted: what curl can send.
func unprotected(id, payload string) *as2.Outgoing {
	h := http.Header{}
	h.Set("Content-Type", "application/edi-x12")
	h.Set("Message-ID", "<"+id+">")
	h.Set("AS2-From", "BUYER")
	h.Set("AS2-To", "SUPPLIER")
	h.Set("Disposition-Notification-To", "BUYER")
	return &as2.Outgoing{Header: h, Body: []byte(payload)}
}

func (e *endpoint) counts() (delivered, rejected int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.delivered {
		delivered += len(c)
	}
	return delivered, len(e.rejected)
}

// TestAgreementEnforcedAtTheEndpoint: a plain POST claiming to be BUYER,
// whose agreement says sign and encrypt, gets insufficient-message-security
// and delivers nothing; its body is not kept (the sender is not
// authenticated). An unknown AS2-From or AS2-To is refused outright: no
// MDN, nothing kept.
func TestAgreementEnforcedAtTheEndpoint(t *testing.T) {
	w := newWorld(t, "    edi_senders: [%s]\n")
	e := newEndpoint(t, w.supplier, 0)
	status, h, body := post(t, e.srv.URL, unprotected("plain@buyer", x12))
	m, err := as2.ParseMDN(h, body, w.buyer.Partners["SUPPLIER"])
	if status != http.StatusOK || err != nil || m.Processed() || !strings.Contains(m.Modifier(), as2.InsufficientMessageSecurity) {
		t.Fatalf("an unprotected message: %d %v %+v %s", status, err, m, body)
	}
	for _, hdr := range []string{"AS2-From", "AS2-To"} {
		out := w.pack(t, w.buyer, "stranger@buyer", x12)
		out.Header.Set(hdr, "STRANGER")
		status, _, body := post(t, e.srv.URL, out)
		if status != http.StatusForbidden || bytes.Contains(body, []byte("processed")) {
			t.Fatalf("%s STRANGER: %d %s", hdr, status, body)
		}
	}
	if d, r := e.counts(); d != 0 || r != 0 {
		t.Fatalf("delivered %d, kept %d refused messages", d, r)
	}
}

// TestDecryptionFailuresOneAnswerOverHTTP: two different failures inside
// an encrypted message (damaged content, a damaged content key) get the
// same status and body, which quote no library, and the same MDN
// disposition when an MDN is asked for.
func TestDecryptionFailuresOneAnswerOverHTTP(t *testing.T) {
	w := newWorld(t, "    edi_senders: [%s]\n")
	e := newEndpoint(t, w.supplier, 0)
	damage := func(at func(n int) int, mdn bool) (int, string, string) {
		out := w.pack(t, w.buyer, "oracle@buyer", x12)
		out.Body = append([]byte(nil), out.Body...)
		out.Body[at(len(out.Body))] ^= 0x5a
		if !mdn {
			out.Header.Del("Disposition-Notification-To")
			out.Header.Del("Disposition-Notification-Options")
		}
		status, h, body := post(t, e.srv.URL, out)
		disposition := ""
		if mdn {
			m, err := as2.ParseMDN(h, body, w.buyer.Partners["SUPPLIER"])
			if err != nil {
				t.Fatalf("the error MDN: %v", err)
			}
			disposition = m.Disposition
			body = nil
		}
		return status, string(body), disposition
	}
	lastBlock := func(n int) int { return n - 20 }
	contentKey := func(n int) int { return 300 } // inside the RSA-encrypted key
	for _, mdn := range []bool{false, true} {
		s1, b1, d1 := damage(lastBlock, mdn)
		s2, b2, d2 := damage(contentKey, mdn)
		if s1 != s2 || b1 != b2 || d1 != d2 {
			t.Fatalf("mdn=%v: two answers: %d %q %q / %d %q %q", mdn, s1, b1, d1, s2, b2, d2)
		}
		for _, lib := range []string{"crypto", "pkcs7", "padding", "rsa"} {
			if strings.Contains(strings.ToLower(b1), lib) {
				t.Fatalf("the answer %q quotes %q", b1, lib)
			}
		}
		if mdn && !strings.HasSuffix(d1, "error: "+as2.DecryptionFailed) {
			t.Fatalf("disposition %q", d1)
		}
	}
	if d, r := e.counts(); d != 0 || r != 0 {
		t.Fatalf("delivered %d, kept %d", d, r)
	}
}

// asyncEndpoint is an endpoint whose asynchronous MDNs are recorded.
func asyncEndpoint(t *testing.T, w *world) (*endpoint, func() []string) {
	e := newEndpoint(t, w.supplier, 0)
	var mu sync.Mutex
	var sent []string
	e.rv.SetSendMDN(func(_ context.Context, to string, _ *as2.Incoming, _ []byte) error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, to)
		return nil
	})
	return e, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), sent...) }
}

// TestAsyncMDNOnlyWhereTheAgreementAllows: Receipt-Delivery-Option is
// followed only for an authenticated message and only to an address the
// partner's agreement lists; an internal address named by a junk message
// from no partner, or by an unauthenticated one, is never posted to, and an
// authenticated message naming an address not listed gets its MDN in the
// response.
func TestAsyncMDNOnlyWhereTheAgreementAllows(t *testing.T) {
	w := newWorld(t, "    edi_senders: [%s]\n    async_mdn_urls: [https://%s.example/as2/mdn]\n")
	e, sent := asyncEndpoint(t, w)
	const internal = "http://127.0.0.1:29555/internal/admin/delete-everything?confirm=1"
	junk := unprotected("junk@nobody", "junk")
	junk.Header.Set("AS2-From", "NOBODY")
	junk.Header.Set("Receipt-Delivery-Option", internal)
	if status, _, _ := post(t, e.srv.URL, junk); status != http.StatusForbidden {
		t.Fatalf("junk from no partner: %d", status)
	}
	plain := unprotected("plain@buyer", x12)
	plain.Header.Set("Receipt-Delivery-Option", internal)
	if status, _, body := post(t, e.srv.URL, plain); status != http.StatusOK || !bytes.Contains(body, []byte(as2.InsufficientMessageSecurity)) {
		t.Fatalf("unauthenticated: %d %s", status, body)
	}
	genuine := w.pack(t, w.buyer, "genuine@buyer", x12)
	genuine.Header.Set("Receipt-Delivery-Option", internal)
	status, h, body := post(t, e.srv.URL, genuine)
	if m, err := as2.ParseMDN(h, body, w.buyer.Partners["SUPPLIER"]); status != http.StatusOK || err != nil || genuine.Check(m, "genuine@buyer", w.buyer.Partners["SUPPLIER"]) != nil {
		t.Fatalf("an address not allowed: %d %v: the MDN should come synchronously (%s)", status, err, body)
	}
	if got := sent(); len(got) != 0 {
		t.Fatalf("MDNs sent to %q", got)
	}
	allowed := w.pack(t, w.buyer, "allowed@buyer", strings.ReplaceAll(x12, "000000905", "000000906"))
	allowed.Header.Set("Receipt-Delivery-Option", "https://BUYER.example/as2/mdn")
	if status, _, body := post(t, e.srv.URL, allowed); status != http.StatusOK || len(body) != 0 {
		t.Fatalf("an allowed address: %d %s", status, body)
	}
	if got := sent(); len(got) != 1 || got[0] != "https://BUYER.example/as2/mdn" {
		t.Fatalf("MDNs sent to %q", got)
	}
}

// TestEDISenderBoundToThePartner: OTHER, correctly signed and encrypted,
// sends an interchange with ISA06 = BUYER and BUYER's next control number:
// refused (an error MDN, nothing delivered), and BUYER's own interchange
// with that number is then delivered.
func TestEDISenderBoundToThePartner(t *testing.T) {
	w := newWorld(t, "    edi_senders: [\"ZZ:%s\"]\n")
	e := newEndpoint(t, w.supplier, 0)
	forged := w.pack(t, w.other, "forged@other", x12) // x12 is BUYER's interchange 905
	status, h, body := post(t, e.srv.URL, forged)
	m, err := as2.ParseMDN(h, body, w.other.Partners["SUPPLIER"])
	if status != http.StatusOK || err != nil || m.Processed() {
		t.Fatalf("OTHER sending as BUYER: %d %v %+v", status, err, m)
	}
	genuine := w.pack(t, w.buyer, "genuine@buyer", x12)
	m, _ = receipt(t, e, w.buyer, genuine, "genuine@buyer")
	if err := genuine.Check(m, "genuine@buyer", w.buyer.Partners["SUPPLIER"]); err != nil {
		t.Fatalf("BUYER's own interchange after OTHER's attempt: %v", err)
	}
	if d, _ := e.counts(); d != 1 {
		t.Fatalf("delivered %d, want BUYER's one", d)
	}
	// A partner whose agreement lists no sender id delivers no EDI.
	w2 := newWorld(t, "")
	e2 := newEndpoint(t, w2.supplier, 0)
	status, h, body = post(t, e2.srv.URL, w2.pack(t, w2.buyer, "unlisted@buyer", x12))
	if m, err := as2.ParseMDN(h, body, w2.buyer.Partners["SUPPLIER"]); status != http.StatusOK || err != nil || m.Processed() {
		t.Fatalf("no edi_senders: %d %v %+v", status, err, m)
	}
}

// TestDeliveredBytesAreThePayload: an EDIFACT interchange ending in a
// newline is delivered byte for byte, the bytes whose MIC the MDN
// reports; two interchanges in one payload are delivered as pieces that
// join to the payload.
func TestDeliveredBytesAreThePayload(t *testing.T) {
	w := newWorld(t, "    edi_senders: [%s]\n")
	e := newEndpoint(t, w.supplier, 0)
	edifact := "UNB+UNOC:3+BUYER:14+SUPPLIER:14+260514:1032+905'UNH+1+ORDERS:D:96A:UN'BGM+220+ORD-1+9'DTM+137:20260514:102'NAD+BY+BUYER::9'UNS+S'CNT+2:1'UNT+7+1'UNZ+1+905'\n"
	out, err := w.buyer.Pack(w.buyer.Partners["SUPPLIER"], "edifact@buyer", "application/edifact", []byte(edifact), testDate)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := receipt(t, e, w.buyer, out, "edifact@buyer")
	if err := out.Check(m, "edifact@buyer", w.buyer.Partners["SUPPLIER"]); err != nil {
		t.Fatal(err)
	}
	two := x12 + "\r\n" + strings.ReplaceAll(x12, "905", "907") + "\n"
	out2 := w.pack(t, w.buyer, "two@buyer", two)
	receipt(t, e, w.buyer, out2, "two@buyer")
	e.mu.Lock()
	defer e.mu.Unlock()
	var got [][]byte
	for _, copies := range e.delivered {
		got = append(got, copies...)
	}
	if len(got) != 3 {
		t.Fatalf("delivered %d pieces, want 3", len(got))
	}
	joined := map[string]bool{}
	for _, g := range got {
		joined[string(g)] = true
	}
	if !joined[edifact] {
		t.Fatalf("the EDIFACT interchange was not delivered byte for byte: %q", got)
	}
	if !joined[x12+"\r\n"] || !joined[strings.ReplaceAll(x12, "905", "907")+"\n"] {
		t.Fatalf("two interchanges: pieces %q do not join to the payload", got)
	}
}

// TestBoundsInFlight: with one message held in delivery, another finds no
// place (MaxInFlight) or no memory (MaxMemory) and is answered 503 with
// Retry-After, before its body is read; once the first is done, it goes
// through.
func TestBoundsInFlight(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*receiver.Config)
	}{
		{"in flight", func(c *receiver.Config) { c.MaxInFlight = 1 }},
		{"memory", func(c *receiver.Config) { c.MaxBytes, c.MaxMemory = 1<<20, 4<<20 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, "    edi_senders: [%s]\n")
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			srv := newReceiver(t, w.supplier, func(cfg *receiver.Config) {
				c.set(cfg)
				cfg.Deliver = func(context.Context, receiver.Delivery) error {
					once.Do(func() { close(entered); <-release })
					return nil
				}
			})
			// 600 KB each: two reserve 4.8 MB, over the 4 MiB bound.
			big := func(id string) *as2.Outgoing {
				return w.pack(t, w.buyer, id, strings.Replace(x12, "ORD-1", "ORD-"+strings.Repeat("1", 600_000), 1))
			}
			first := big("first@buyer")
			done := make(chan int)
			go func() {
				status, _, _ := post(t, srv.URL, first)
				done <- status
			}()
			<-entered
			second := big("second@buyer")
			status, h, _ := post(t, srv.URL, second)
			if status != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
				t.Fatalf("a message beyond the bound: %d", status)
			}
			close(release)
			if status := <-done; status != http.StatusOK {
				t.Fatalf("the first message: %d", status)
			}
		})
	}
}

// TestEDIThatDoesNotReadCleanlyIsRefused: EDI that a stray byte, a line of
// junk or a second envelope header keeps from reading cleanly is refused
// (an error MDN, nothing delivered), never delivered as a payload that is
// "not EDI" past the partner's edi_senders: OTHER sending BUYER's
// interchanges so is refused, as is any partner without edi_senders.
func TestEDIThatDoesNotReadCleanlyIsRefused(t *testing.T) {
	const edifactBuyer = "UNB+UNOC:3+BUYER:14+SUPPLIER:14+260514:1032+905'UNH+1+ORDERS:D:96A:UN'BGM+220+ORD-1+9'UNT+3+1'UNZ+1+905'"
	x12Other := strings.NewReplacer("ZZ*BUYER          ", "ZZ*OTHER          ", "000000905", "000000906").Replace(x12)
	payloads := map[string]string{
		"a trailing ~":             x12 + "~",
		"a trailing CR LF NUL":     x12 + "\r\n\x00",
		"a line of junk before":    "JUNK\n" + x12,
		"a trailing EDIFACT '":     edifactBuyer + "'",
		"a second UNB":             strings.Replace(edifactBuyer, "UNH+1", "UNB+UNOC:3+OTHER:14+SUPPLIER:14+260514:1032+907'UNH+1", 1),
		"an ISA nested in another": strings.Replace(x12Other, "GS*", strings.TrimSuffix(x12[:strings.Index(x12, "GS*")], "")+"GS*", 1),
	}
	for _, agreement := range []string{"    edi_senders: [%s]\n", ""} {
		w := newWorld(t, agreement)
		e := newEndpoint(t, w.supplier, 0)
		n := 0
		for what, payload := range payloads {
			n++
			id := fmt.Sprintf("stray-%d@other", n)
			status, h, body := post(t, e.srv.URL, w.pack(t, w.other, id, payload))
			m, err := as2.ParseMDN(h, body, w.other.Partners["SUPPLIER"])
			if status != http.StatusOK || err != nil || m.Processed() {
				t.Errorf("agreement %q, OTHER sending %s: %d %v, processed %v", agreement, what, status, err, m != nil && m.Processed())
			}
		}
		if d, _ := e.counts(); d != 0 {
			t.Errorf("agreement %q: %d deliveries, want none", agreement, d)
		}
	}
	// A payload in which nothing reads as EDI is still delivered whole.
	w := newWorld(t, "    edi_senders: [%s]\n")
	e := newEndpoint(t, w.supplier, 0)
	m, _ := receipt(t, e, w.other, w.pack(t, w.other, "pdf@other", "%PDF-1.7 an invoice, not EDI"), "pdf@other")
	if !m.Processed() {
		t.Fatalf("a payload that is not EDI: %+v", m)
	}
}

// TestNoSignedMDNForAStranger: a stranger claiming BUYER's name posts
// random bytes as an encrypted message with BUYER's predictable
// Message-ID and asks for a signed receipt: the error MDN it gets is not
// signed — BUYER's mdn_sign policy refuses it, so it cannot be replayed
// to BUYER to turn BUYER's row dead.
func TestNoSignedMDNForAStranger(t *testing.T) {
	w := newWorld(t, "    edi_senders: [%s]\n")
	e := newEndpoint(t, w.supplier, 0)
	out := unprotected("INV-1@buyer.as2", "")
	out.Header.Set("Content-Type", `application/pkcs7-mime; smime-type=enveloped-data; name="smime.p7m"`)
	out.Header.Set("Disposition-Notification-Options", "signed-receipt-protocol=optional, pkcs7-signature; signed-receipt-micalg=optional, sha-256")
	out.Body = bytes.Repeat([]byte{0x30, 0x82, 0x01, 0xfc}, 128)
	status, h, body := post(t, e.srv.URL, out)
	if status != http.StatusOK || !bytes.Contains(body, []byte("error")) {
		t.Fatalf("the stranger's message: %d %s", status, body)
	}
	if strings.Contains(h.Get("Content-Type"), "multipart/signed") {
		t.Fatalf("the stranger got an MDN signed with SUPPLIER's key: %s", h.Get("Content-Type"))
	}
	if m, err := as2.ParseMDN(h, body, w.buyer.Partners["SUPPLIER"]); err == nil && m != nil && m.Signed {
		t.Fatal("the MDN verifies as signed by SUPPLIER")
	}
	// BUYER's own encrypted, signed message still gets a signed receipt.
	genuine := w.pack(t, w.buyer, "genuine@buyer", x12)
	if m, _ := receipt(t, e, w.buyer, genuine, "genuine@buyer"); !m.Signed {
		t.Fatal("BUYER's own message got an unsigned receipt")
	}
}

// TestOneStrangerCannotStopTheEndpoint: a stranger on another address who
// names a partner holds its connections open — one declaring 64 MiB and
// sending a byte, sixteen declaring 1 KiB and sending a byte — and the
// partner's own message is still delivered: memory is taken for the bytes
// read, a sender still sending holds no place of the messages being
// handled, and one address gets MaxPerPeer places at most. One that names
// no partner is refused on its headers, before its body is read.
func TestOneStrangerCannotStopTheEndpoint(t *testing.T) {
	w := newWorld(t, "    edi_senders: [%s]\n")
	e := newEndpoint(t, w.supplier, 64<<20)
	reading := receiver.ReadingSignal(e.rv)
	addr := strings.TrimPrefix(e.srv.URL, "http://")
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	hold := func(from string, length int) net.Conn {
		c, err := dialer.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nAS2-From: %s\r\nAS2-To: SUPPLIER\r\nContent-Length: %d\r\n\r\nx", addr, from, length)
		return c
	}
	// An unknown sender is answered 403 without a byte of its body read.
	c := hold("STRANGER", 64<<20)
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a stranger's 64 MiB: %v %v, want 403", resp, err)
	}
	hold("BUYER", 64<<20)
	reading.WaitOrTimeout(t)
	for range 16 {
		hold("BUYER", 1024)
	}
	for range 3 { // the others past MaxPerPeer are answered 503 at once
		reading.WaitOrTimeout(t)
	}
	genuine := w.pack(t, w.buyer, "genuine@buyer", x12)
	m, _ := receipt(t, e, w.buyer, genuine, "genuine@buyer")
	if err := genuine.Check(m, "genuine@buyer", w.buyer.Partners["SUPPLIER"]); err != nil {
		t.Fatalf("BUYER's message while a stranger holds connections: %v", err)
	}
}
