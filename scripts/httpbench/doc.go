// Command httpbench runs the two baselines of scripts/bench-http.sh:
//
//	httpbench upstream ADDR            a trivial upstream: 201 and a short body
//	httpbench proxy ADDR UPSTREAM_URL  a bare httputil.ReverseProxy, no idempotency
package main
