package lambdaidem_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/lambdaidem"
	"github.com/idemgo/idem/store/memstore"
)

func restEvent(key, auth, body string) events.APIGatewayProxyRequest {
	h := map[string]string{"Content-Type": "application/json"}
	if key != "" {
		h["Idempotency-Key"] = key
	}
	if auth != "" {
		h["Authorization"] = auth
	}
	return events.APIGatewayProxyRequest{HTTPMethod: "POST", Path: "/orders", Headers: h, Body: body}
}

// orders is a REST handler that creates an order per call.
type orders struct {
	n       atomic.Int64
	block   chan struct{} // if set, a call waits for it
	started chan struct{}
}

func (o *orders) handle(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
	if o.started != nil {
		o.started <- struct{}{}
	}
	if o.block != nil {
		<-o.block
	}
	n := o.n.Add(1)
	return events.APIGatewayProxyResponse{StatusCode: http.StatusCreated, Headers: map[string]string{"Content-Type": "application/json"},
		Body: fmt.Sprintf(`{"order":%d}`, n)}, nil
}

func restHandler(t *testing.T, o *orders, cfg lambdaidem.HTTPConfig) func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
	t.Helper()
	if cfg.HTTP.Store == nil && cfg.HTTP.Guard == nil {
		s := memstore.New(memstore.Config{})
		t.Cleanup(func() { s.Close() })
		cfg.HTTP.Store = s
	}
	h, err := lambdaidem.APIGatewayProxy(cfg, o.handle)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestAPIGatewayProxy: a REST API's function behind the wrapper answers as
// httpidem's middleware does: the same key twice is one order, replayed
// with Idempotent-Replayed; another payload under it is 422 and runs
// nothing; another caller's same key is another key; a concurrent
// duplicate is 409; a bad key is 400.
func TestAPIGatewayProxy(t *testing.T) {
	o := &orders{}
	h := restHandler(t, o, lambdaidem.HTTPConfig{})
	ctx := context.Background()
	first, err := h(ctx, restEvent(`"order-1"`, "Bearer alice", `{"sku":"A1"}`))
	if err != nil || first.StatusCode != 201 || first.Body != `{"order":1}` {
		t.Fatalf("first: %d %q %v", first.StatusCode, first.Body, err)
	}
	again, _ := h(ctx, restEvent(`"order-1"`, "Bearer alice", `{"sku":"A1"}`))
	if again.StatusCode != 201 || again.Body != `{"order":1}` || again.MultiValueHeaders[httpidem.ReplayedHeader][0] != "true" {
		t.Fatalf("the retry: %d %q %v", again.StatusCode, again.Body, again.MultiValueHeaders)
	}
	other, _ := h(ctx, restEvent(`"order-1"`, "Bearer alice", `{"sku":"B2"}`))
	if other.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("another payload under the key: %d", other.StatusCode)
	}
	bob, _ := h(ctx, restEvent(`"order-1"`, "Bearer bob", `{"sku":"A1"}`))
	if bob.StatusCode != 201 || bob.Body != `{"order":2}` {
		t.Fatalf("another caller's order-1: %d %q", bob.StatusCode, bob.Body)
	}
	bad, _ := h(ctx, restEvent(`"unclosed`, "Bearer alice", `{}`))
	if bad.StatusCode != http.StatusBadRequest {
		t.Fatalf("a bad key: %d", bad.StatusCode)
	}
	if o.n.Load() != 2 {
		t.Fatalf("%d orders, want 2", o.n.Load())
	}

	// A concurrent duplicate.
	o2 := &orders{block: make(chan struct{}), started: make(chan struct{}, 1)}
	h2 := restHandler(t, o2, lambdaidem.HTTPConfig{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = h2(ctx, restEvent(`"order-2"`, "Bearer alice", `{}`))
	}()
	<-o2.started
	dup, _ := h2(ctx, restEvent(`"order-2"`, "Bearer alice", `{}`))
	close(o2.block)
	wg.Wait()
	if dup.StatusCode != http.StatusConflict {
		t.Fatalf("a concurrent duplicate: %d", dup.StatusCode)
	}
}

// TestHandlerErrorReleasesTheKey: a handler that fails makes the
// invocation fail (API Gateway answers 502) and keeps nothing: the retry
// runs.
func TestHandlerErrorReleasesTheKey(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	var calls atomic.Int32
	h, err := lambdaidem.APIGatewayProxy(lambdaidem.HTTPConfig{HTTP: httpidem.Config{Store: s}}, func(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		if calls.Add(1) == 1 {
			return events.APIGatewayProxyResponse{}, errors.New("database unreachable")
		}
		return events.APIGatewayProxyResponse{StatusCode: 201, Body: "created"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h(context.Background(), restEvent(`"k"`, "Bearer alice", `{}`)); err == nil || err.Error() != "database unreachable" {
		t.Fatalf("the failed invocation returned %v", err)
	}
	resp, err := h(context.Background(), restEvent(`"k"`, "Bearer alice", `{}`))
	if err != nil || resp.StatusCode != 201 || calls.Load() != 2 {
		t.Fatalf("the retry: %d %v, %d calls", resp.StatusCode, err, calls.Load())
	}
}

// TestEventRequestAsTheHandlerSeesIt: the request the middleware sees is
// the event's — method, path and query, headers in canonical form
// whatever their case in the event, the body and its length — and an event
// whose method is not an HTTP token is refused before anything runs.
func TestEventRequestAsTheHandlerSeesIt(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	var seen *http.Request
	var body []byte
	mw := httpidem.Config{Store: s, Fingerprint: func(r *http.Request, b []byte) string {
		seen, body = r, b
		return "fp"
	}}
	var calls atomic.Int32
	h, err := lambdaidem.APIGatewayProxy(lambdaidem.HTTPConfig{HTTP: mw}, func(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		calls.Add(1)
		return events.APIGatewayProxyResponse{StatusCode: 201}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := restEvent(`"k"`, "Bearer alice", `{"sku":"A1"}`)
	ev.Headers["x-request-id"] = "r-1"
	ev.QueryStringParameters = map[string]string{"dry": "no"}
	if resp, err := h(context.Background(), ev); err != nil || resp.StatusCode != 201 {
		t.Fatalf("%d %v", resp.StatusCode, err)
	}
	if seen.Method != "POST" || seen.URL.RequestURI() != "/orders?dry=no" || seen.Header.Get("X-Request-Id") != "r-1" ||
		seen.Header["X-Request-Id"] == nil || seen.ContentLength != int64(len(`{"sku":"A1"}`)) || string(body) != `{"sku":"A1"}` {
		t.Fatalf("the request: %s %s %v length %d body %q", seen.Method, seen.URL.RequestURI(), seen.Header, seen.ContentLength, body)
	}
	ev.HTTPMethod = "GE T"
	if _, err := h(context.Background(), ev); err == nil || calls.Load() != 1 {
		t.Fatalf("a method with a space: %v, %d calls", err, calls.Load())
	}
}

// TestAPIGatewayV2AndFunctionURL: an HTTP API's and a function URL's
// events, keyed by the JWT authorizer's subject (AuthorizerPrincipal): the
// same subject's retry is replayed, another subject's key is its own.
func TestAPIGatewayV2AndFunctionURL(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	cfg := lambdaidem.HTTPConfig{HTTP: httpidem.Config{Store: s, Principal: lambdaidem.AuthorizerPrincipal}}
	var n atomic.Int64
	v2, err := lambdaidem.APIGatewayV2(cfg, func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		return events.APIGatewayV2HTTPResponse{StatusCode: 201, Body: fmt.Sprint("order ", n.Add(1)), Cookies: []string{"seen=1"}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	event := func(sub string) events.APIGatewayV2HTTPRequest {
		ev := events.APIGatewayV2HTTPRequest{RawPath: "/orders", Headers: map[string]string{"idempotency-key": `"o-1"`}, Body: "{}"}
		ev.RequestContext.HTTP.Method = "POST"
		ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"sub": sub}}}
		return ev
	}
	a1, _ := v2(context.Background(), event("alice"))
	a2, _ := v2(context.Background(), event("alice"))
	b1, _ := v2(context.Background(), event("bob"))
	if a1.Body != "order 1" || a2.Body != "order 1" || a2.Headers[httpidem.ReplayedHeader] != "true" || b1.Body != "order 2" {
		t.Fatalf("alice %q, alice again %q %v, bob %q", a1.Body, a2.Body, a2.Headers, b1.Body)
	}
	if len(a1.Cookies) != 1 || len(a2.Cookies) != 0 {
		t.Fatalf("cookies: first %v, replay %v (a session cookie is not replayed)", a1.Cookies, a2.Cookies)
	}

	url, err := lambdaidem.FunctionURL(lambdaidem.HTTPConfig{HTTP: httpidem.Config{Store: s}}, func(ctx context.Context, ev events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		return events.LambdaFunctionURLResponse{StatusCode: 201, Body: fmt.Sprint("order ", n.Add(1))}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ev := events.LambdaFunctionURLRequest{RawPath: "/orders", Headers: map[string]string{"idempotency-key": `"u-1"`, "authorization": "Bearer carol"}, Body: "{}"}
	ev.RequestContext.HTTP.Method = "POST"
	u1, _ := url(context.Background(), ev)
	u2, _ := url(context.Background(), ev)
	if u1.Body != "order 3" || u2.Body != "order 3" || u2.Headers[httpidem.ReplayedHeader] != "true" {
		t.Fatalf("function URL: %q then %q %v", u1.Body, u2.Body, u2.Headers)
	}
}

// TestHTTPClaimEndsWithTheInvocation: the claim of a request whose
// handler outlives the invocation ends at its deadline plus the margin;
// the handler's context ends before the deadline, so the function answers.
func TestHTTPClaimEndsWithTheInvocation(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s, Lease: time.Minute})
	h, err := lambdaidem.APIGatewayProxy(lambdaidem.HTTPConfig{HTTP: httpidem.Config{Guard: g}, LeaseMargin: 100 * time.Millisecond, ReturnBefore: 200 * time.Millisecond},
		func(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
			<-ctx.Done()
			return events.APIGatewayProxyResponse{}, ctx.Err()
		})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_, _ = h(ctx, restEvent(`"slow-1"`, "Bearer alice", `{}`))
	if time.Now().After(deadline) {
		t.Fatal("the function answered after its deadline")
	}
	recs, err := s.List(context.Background(), "", 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("records %v %v", recs, err)
	}
	if limit := deadline.Add(110 * time.Millisecond); recs[0].LeaseUntil.After(limit) {
		t.Fatalf("the claim lives %v past the deadline", recs[0].LeaseUntil.Sub(deadline))
	}
}

// TestFunction: any event type, keyed by a function of it: the second
// invocation with the key gets the first's result without running.
func TestFunction(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	type Order struct{ ID, SKU string }
	type Receipt struct{ Number int }
	var runs atomic.Int32
	f, err := lambdaidem.Function(g, lambdaidem.FunctionConfig[Order]{Scope: "orders", Key: func(o Order) (string, error) { return o.ID, nil }},
		func(ctx context.Context, o Order) (Receipt, error) { return Receipt{int(runs.Add(1))}, nil })
	if err != nil {
		t.Fatal(err)
	}
	a, err1 := f(context.Background(), Order{"O-1", "A1"})
	b, err2 := f(context.Background(), Order{"O-1", "A1"})
	if err1 != nil || err2 != nil || a != b || runs.Load() != 1 {
		t.Fatalf("%v %v, %v %v, %d runs", a, err1, b, err2, runs.Load())
	}
}

// TestHTTPBinaryBodies: a request body in base64 reaches the handler in
// the event as it came; a response that is not UTF-8 goes back in base64, and so does
// its replay; a text response goes back as it is, first and replayed.
func TestHTTPBinaryBodies(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	png := []byte{0x89, 'P', 'N', 'G', 0xff, 0x00}
	var seen atomic.Value
	h, err := lambdaidem.APIGatewayProxy(lambdaidem.HTTPConfig{HTTP: httpidem.Config{Store: s}},
		func(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
			seen.Store(ev.Body)
			if ev.Path == "/text" {
				return events.APIGatewayProxyResponse{StatusCode: 201, Body: "créé"}, nil
			}
			return events.APIGatewayProxyResponse{StatusCode: 201, Body: base64.StdEncoding.EncodeToString(png), IsBase64Encoded: true}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	ev := restEvent(`"bin-1"`, "Bearer alice", base64.StdEncoding.EncodeToString([]byte{0xde, 0xad, 0xbe, 0xef}))
	ev.IsBase64Encoded = true
	for i, want := range []string{"", "true"} {
		resp, err := h(context.Background(), ev)
		if err != nil || resp.StatusCode != 201 || !resp.IsBase64Encoded || resp.Body != base64.StdEncoding.EncodeToString(png) ||
			resp.MultiValueHeaders[httpidem.ReplayedHeader] != nil != (want != "") {
			t.Fatalf("binary response %d: %+v, %v", i, resp, err)
		}
	}
	if seen.Load() != base64.StdEncoding.EncodeToString([]byte{0xde, 0xad, 0xbe, 0xef}) {
		t.Fatalf("the handler saw %q", seen.Load())
	}
	text := restEvent(`"text-1"`, "Bearer alice", `{}`)
	text.Path = "/text"
	for i := range 2 {
		resp, err := h(context.Background(), text)
		if err != nil || resp.StatusCode != 201 || resp.IsBase64Encoded || resp.Body != "créé" {
			t.Fatalf("text response %d: %+v, %v", i, resp, err)
		}
	}
}
