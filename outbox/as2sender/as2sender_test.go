package as2sender_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/edi"
	"github.com/idemgo/idem/outbox/as2sender"
	"github.com/idemgo/idem/outbox/sendertest"
)

const mdnProcessed = "Disposition: automatic-action/MDN-sent-automatically; processed\r\n"

// partner is an AS2 receiver that records every message and answers with
// a synchronous MDN (or with status when it is not 200).
func partner(t *testing.T, status int, mdn string) (*httptest.Server, func() []sendertest.Delivery) {
	var mu sync.Mutex
	var got []sendertest.Delivery
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Header.Get("AS2-From") != "BUYER" || r.Header.Get("AS2-To") != "SUPPLIER" || r.Header.Get("AS2-Version") == "" {
			http.Error(w, "not AS2", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, sendertest.Delivery{KeyField: r.Header.Get("Message-ID"), Payload: b})
		mu.Unlock()
		w.WriteHeader(status)
		io.WriteString(w, mdn)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []sendertest.Delivery {
		mu.Lock()
		defer mu.Unlock()
		return append([]sendertest.Delivery(nil), got...)
	}
}

// TestConformance: AS2 has no duplicate answer; the partner receives every
// attempt with the same Message-ID (RFC 4130 §5.5 lets it drop the copies).
func TestConformance(t *testing.T) {
	const query = "/as2?from=BUYER&to=SUPPLIER&host=buyer.example"
	sendertest.Run(t, sendertest.Target{
		Sender: as2sender.New(&http.Client{Timeout: 5 * time.Second}),
		Destination: func(t *testing.T) (string, func() []sendertest.Delivery) {
			srv, received := partner(t, http.StatusOK, mdnProcessed)
			return "as2+" + srv.URL + query, received
		},
		KeyField:    func(key string) string { return edi.AS2MessageID(key, "buyer.example") },
		Unreachable: func(*testing.T) string { return "as2+http://127.0.0.1:1" + query },
		Refused: func(t *testing.T) []string {
			negative, _ := partner(t, http.StatusOK, "Disposition: automatic-action/MDN-sent-automatically; failed/failure: unexpected-processing-error\r\n")
			rejecting, _ := partner(t, http.StatusForbidden, "unknown partner")
			return []string{"as2+" + negative.URL + query, "as2+" + rejecting.URL + query,
				"as2+http://127.0.0.1:1/as2?to=SUPPLIER", "as2+ftp://partner/as2?from=BUYER&to=SUPPLIER"}
		},
	})
}
