package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: httpbench upstream ADDR | httpbench proxy ADDR UPSTREAM_URL")
		os.Exit(2)
	}
	var h http.Handler
	switch os.Args[1] {
	case "upstream":
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"pay_123","status":"accepted"}`)
		})
	case "proxy":
		if len(os.Args) != 4 {
			fmt.Fprintln(os.Stderr, "usage: httpbench proxy ADDR UPSTREAM_URL")
			os.Exit(2)
		}
		up, err := url.Parse(os.Args[3])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256 // as idem serve's proxy
		h = &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(up); pr.SetXForwarded() }, Transport: t}
	default:
		fmt.Fprintf(os.Stderr, "httpbench: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
	if err := http.ListenAndServe(os.Args[2], h); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
