package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/store/memstore"
)

func ExampleNew() {
	store := memstore.New(memstore.Config{})
	defer store.Close()
	mw, err := httpidem.New(httpidem.Config{Store: store})
	if err != nil {
		panic(err)
	}
	charges := 0
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge ch_%d\n", charges)
	})
	srv := httptest.NewServer(mw(api)) // a service: http.ListenAndServe(addr, mw(api))
	defer srv.Close()

	for range 2 { // the client retries after a timeout, with the same key
		req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader("amount=2500"))
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		req.Header.Set("Authorization", "Bearer sk_test_alice") // the response is alice's alone
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body)
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" charge ch_1
	// 201 replayed="true" charge ch_1
	// charges: 1
}

// A client that retries: the Transport gives the POST one key and sends it
// again after the 503; the service, behind the middleware, answers the
// retry from the run that already happened.
func ExampleTransport() {
	store := memstore.New(memstore.Config{})
	defer store.Close()
	mw, err := httpidem.New(httpidem.Config{Store: store})
	if err != nil {
		panic(err)
	}
	charges := 0
	api := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge ch_%d", charges)
	})))
	defer api.Close()
	lost := false // a gateway that loses the first answer, after the charge
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, _ := http.NewRequest(r.Method, api.URL+r.URL.Path, r.Body)
		out.Header = r.Header
		resp, err := http.DefaultClient.Do(out)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		if !lost {
			lost = true
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Idempotent-Replayed", resp.Header.Get("Idempotent-Replayed"))
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	defer gateway.Close()

	client := &http.Client{Transport: &httpidem.Transport{}} // wraps http.DefaultTransport
	req, _ := http.NewRequest("POST", gateway.URL+"/charges", strings.NewReader("amount=2500"))
	req.Header.Set("Authorization", "Bearer sk_test_alice")
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("%d %s replayed=%v charges=%d\n", resp.StatusCode, body, httpidem.Replayed(resp), charges)
	// Output:
	// 201 charge ch_1 replayed=true charges=1
}
