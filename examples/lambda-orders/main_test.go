package main

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemgo/idem/internal/testenv"
)

func post(key, sub, body string) events.APIGatewayV2HTTPRequest {
	ev := events.APIGatewayV2HTTPRequest{RawPath: "/orders", Headers: map[string]string{"idempotency-key": key, "content-type": "application/json"}, Body: body}
	ev.RequestContext.HTTP.Method = "POST"
	ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
		JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"sub": sub}}}
	return ev
}

// TestOrdersOncePerKey drives the function with HTTP API events on the
// tests' DynamoDB: the same key twice (one order, the retry replayed),
// another body under the key (422), another caller's same key (its own
// order), and duplicates sent at once (one order; the others replayed or
// told to retry).
func TestOrdersOncePerKey(t *testing.T) {
	testenv.DynamoDB(t)
	h, err := handler(context.Background(), testenv.RandomName("idem_orders_"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := orders.Load()
	first, _ := h(ctx, post(`"o-1"`, "alice", `{"sku":"A1","qty":2}`))
	retry, _ := h(ctx, post(`"o-1"`, "alice", `{"sku":"A1","qty":2}`))
	if first.StatusCode != http.StatusCreated || retry.Body != first.Body || retry.Headers["Idempotent-Replayed"] != "true" {
		t.Fatalf("first %d %q, retry %d %q %v", first.StatusCode, first.Body, retry.StatusCode, retry.Body, retry.Headers)
	}
	if other, _ := h(ctx, post(`"o-1"`, "alice", `{"sku":"B2","qty":1}`)); other.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("another body under the key: %d", other.StatusCode)
	}
	bob, _ := h(ctx, post(`"o-1"`, "bob", `{"sku":"A1","qty":2}`))
	if bob.StatusCode != http.StatusCreated || bob.Body == first.Body {
		t.Fatalf("bob's o-1: %d %q", bob.StatusCode, bob.Body)
	}
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := h(ctx, post(`"o-2"`, "carol", `{"sku":"C3","qty":1}`))
			statuses[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	for _, st := range statuses {
		if st != http.StatusCreated && st != http.StatusConflict {
			t.Fatalf("a concurrent duplicate got %d", st)
		}
	}
	if n := orders.Load() - before; n != 3 {
		t.Fatalf("%d orders, want 3 (alice's, bob's, carol's)", n)
	}
}
