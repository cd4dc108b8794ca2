// Command hello-api is the smallest HTTP service to put idem serve in
// front of: POST /orders creates an order and answers its number, counting
// every order it ever created, so a retry that ran twice shows.
//
//	go run ./examples/hello-api --listen 127.0.0.1:9000
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"sync/atomic"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on")
	flag.Parse()
	log.Printf("hello-api on http://%s (POST /orders)", *listen)
	srv := &http.Server{Addr: *listen, Handler: newAPI(), ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// newAPI serves POST /orders: each call creates the next order.
func newAPI() http.Handler {
	var orders atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		n := orders.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "{\"order\":%d,\"fence\":%q}\n", n, r.Header.Get("Idempotency-Fence"))
	})
	return mux
}
