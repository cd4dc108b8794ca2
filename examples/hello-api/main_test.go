package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestEachPostCreatesAnOrder: without idem in front, every POST is a new
// order — what the getting-started guide's gateway prevents for a retry.
func TestEachPostCreatesAnOrder(t *testing.T) {
	srv := httptest.NewServer(newAPI())
	defer srv.Close()
	for _, want := range []string{"{\"order\":1,\"fence\":\"\"}\n", "{\"order\":2,\"fence\":\"\"}\n"} {
		resp, err := http.Post(srv.URL+"/orders", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(b) != want {
			t.Fatalf("POST /orders: %d %q, want 201 %q", resp.StatusCode, b, want)
		}
	}
}
