package lambdaidem

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/httpidem"
)

// HTTPConfig configures the handlers of HTTP events: API Gateway REST APIs
// (APIGatewayProxy), HTTP APIs (APIGatewayV2) and function URLs
// (FunctionURL). They run the event through httpidem's middleware, so a
// function gets exactly what httpidem gives a net/http handler: the
// Idempotency-Key header, 409 while the key is in progress, 422 for
// another payload under it, 400 for a bad key, the first response
// replayed with Idempotent-Replayed, responses scoped by the caller.
type HTTPConfig struct {
	// HTTP is the middleware's configuration: its Store or Guard is
	// required. Its Principal defaults to the Authorization header, else
	// the cookies (httpidem.DefaultPrincipal); AuthorizerPrincipal takes the
	// caller from API Gateway's authorizer instead. Its FinishTimeout
	// defaults here to a millisecond: a function's work ends with its
	// invocation.
	HTTP httpidem.Config
	// LeaseMargin and ReturnBefore bound the claim by the invocation, as
	// Config's do for SQS batches: the claim's lease ends LeaseMargin
	// (default 1s) after the invocation's deadline, and the handler's
	// context ReturnBefore (default 500ms) before it.
	LeaseMargin, ReturnBefore time.Duration
}

// httpCore runs events through the middleware.
type httpCore struct {
	before  time.Duration
	handler http.Handler // the middleware around the function's handler
}

func newHTTPCore(cfg HTTPConfig) (*httpCore, error) {
	if cfg.LeaseMargin < 0 || cfg.ReturnBefore < 0 {
		return nil, errors.New("idem/lambdaidem: HTTPConfig.LeaseMargin and ReturnBefore must not be negative")
	}
	if cfg.LeaseMargin == 0 {
		cfg.LeaseMargin = time.Second
	}
	if cfg.ReturnBefore == 0 {
		cfg.ReturnBefore = 500 * time.Millisecond
	}
	if cfg.HTTP.FinishTimeout == 0 {
		cfg.HTTP.FinishTimeout = time.Millisecond
	}
	margin := cfg.LeaseMargin
	cfg.HTTP.LeaseDeadline = func(r *http.Request) time.Time {
		if inv, ok := r.Context().Value(invocationKey{}).(*invocation); ok && !inv.deadline.IsZero() {
			return inv.deadline.Add(margin)
		}
		return time.Time{}
	}
	mw, err := httpidem.New(cfg.HTTP)
	if err != nil {
		return nil, err
	}
	c := &httpCore{before: cfg.ReturnBefore}
	c.handler = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inv := invocationOf(w, r)
		resp, err := inv.handler.call(r.Context(), w.Header())
		if err != nil {
			inv.err = err
			w.WriteHeader(http.StatusInternalServerError) // released: the retry runs (a cancelled handler's claim is held)
			return
		}
		if resp.status == 0 {
			resp.status = http.StatusOK
		}
		w.WriteHeader(resp.status)
		if resp.isText {
			_, _ = io.WriteString(w, resp.text)
		} else {
			_, _ = w.Write(resp.body)
		}
	}))
	return c, nil
}

// invocationOf returns the invocation a request to the function's handler
// was made from: found from the response writer — the invocation's own,
// under the middleware's — without a walk up the request's contexts.
func invocationOf(w http.ResponseWriter, r *http.Request) *invocation {
	for {
		if b, ok := w.(*responseBuffer); ok {
			return b.inv
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return r.Context().Value(invocationKey{}).(*invocation)
		}
		w = u.Unwrap()
	}
}

// invocationKey carries an *invocation in a request's context.
type invocationKey struct{}

// invocation is one event on its way through the middleware: the
// function's handler, called with the event it was given, and its error;
// and the context of the request made from it — the invocation's, ending
// ReturnBefore ahead of the invocation's deadline, and carrying the
// invocation (invocationKey). That context's timer is made only once
// something waits on it (Done, AfterFunc, a context made from it): a
// handler and a store that never wait cost none. The request's URL, body
// and response are fields of it, made with it.
type invocation struct {
	parent   context.Context // the invocation's context
	event    any
	deadline time.Time // the invocation's (zero without one)
	returnBy time.Time // when the context ends (zero: with parent)
	handler  eventHandler
	err      error

	once    sync.Once
	bounded context.Context // parent until returnBy, made on first wait
	cancel  context.CancelFunc
	ended   atomic.Bool

	url  url.URL
	body eventBody
	w    responseBuffer
}

// eventHandler calls a function's handler with the event it was given,
// and writes its response's header into h.
type eventHandler interface {
	call(ctx context.Context, h http.Header) (httpResponse, error)
}

// endedContext is the context of an invocation waited on after it ended.
var endedContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// waitable returns the context that ends at returnBy, making it on the
// first call.
func (v *invocation) waitable() context.Context {
	if v.returnBy.IsZero() {
		return v.parent
	}
	v.once.Do(func() { v.bounded, v.cancel = context.WithDeadline(v.parent, v.returnBy) })
	return v.bounded
}

// end ends the context once the event was served.
func (v *invocation) end() {
	v.ended.Store(true)
	v.once.Do(func() { v.bounded = endedContext })
	if v.cancel != nil {
		v.cancel()
	}
}

func (v *invocation) Deadline() (time.Time, bool) {
	if v.returnBy.IsZero() {
		return v.parent.Deadline()
	}
	return v.returnBy, true
}

func (v *invocation) Done() <-chan struct{} { return v.waitable().Done() }

func (v *invocation) Err() error {
	if v.returnBy.IsZero() || (!v.ended.Load() && time.Now().Before(v.returnBy)) {
		return v.parent.Err()
	}
	return v.waitable().Err()
}

func (v *invocation) Value(key any) any {
	if key == (invocationKey{}) {
		return v
	}
	return v.parent.Value(key)
}

// AfterFunc runs f once the context ends (as context.AfterFunc does): the
// context package uses it for contexts made from this one, instead of a
// goroutine each.
func (v *invocation) AfterFunc(f func()) (stop func() bool) {
	return context.AfterFunc(v.waitable(), f)
}

// eventBody is a request's body: the event's, as it is or decoded.
type eventBody struct {
	text    strings.Reader
	decoded bytes.Reader
	isText  bool
}

func (b *eventBody) Read(p []byte) (int, error) {
	if b.isText {
		return b.text.Read(p)
	}
	return b.decoded.Read(p)
}

func (b *eventBody) Close() error { return nil }

// EventFrom returns the Lambda event of a request made from one: an
// events.APIGatewayProxyRequest, events.APIGatewayV2HTTPRequest or
// events.LambdaFunctionURLRequest (for a Principal or Fingerprint of
// yours).
func EventFrom(r *http.Request) (any, bool) {
	inv, ok := r.Context().Value(invocationKey{}).(*invocation)
	if !ok {
		return nil, false
	}
	return inv.event, true
}

// AuthorizerPrincipal names the caller as API Gateway's authorizer did:
// a JWT authorizer's "sub" claim, an IAM caller's ARN, a Lambda or Cognito
// authorizer's principalId or "sub" claim; else, as httpidem's default,
// the Authorization header or the cookies.
func AuthorizerPrincipal(r *http.Request) string {
	ev, _ := EventFrom(r)
	switch ev := ev.(type) {
	case *events.APIGatewayV2HTTPRequest:
		if a := ev.RequestContext.Authorizer; a != nil {
			switch {
			case a.JWT != nil && a.JWT.Claims["sub"] != "":
				return "jwt:" + a.JWT.Claims["sub"]
			case a.IAM != nil && a.IAM.UserARN != "":
				return "iam:" + a.IAM.UserARN
			case a.Lambda["principalId"] != nil && fmt.Sprint(a.Lambda["principalId"]) != "":
				return "lambda:" + fmt.Sprint(a.Lambda["principalId"])
			}
		}
	case *events.APIGatewayProxyRequest:
		a := ev.RequestContext.Authorizer
		if id, ok := a["principalId"].(string); ok && id != "" {
			return "authorizer:" + id
		}
		if claims, ok := a["claims"].(map[string]any); ok {
			if sub, ok := claims["sub"].(string); ok && sub != "" {
				return "cognito:" + sub
			}
		}
		if arn := ev.RequestContext.Identity.UserArn; arn != "" {
			return "iam:" + arn
		}
	case *events.LambdaFunctionURLRequest:
		if a := ev.RequestContext.Authorizer; a != nil && a.IAM != nil && a.IAM.UserARN != "" {
			return "iam:" + a.IAM.UserARN
		}
	}
	return httpidem.DefaultPrincipal(r)
}

// httpRequest is what the three event kinds say of a request.
type httpRequest struct {
	method, path, rawQuery string
	header                 http.Header
	body                   string
	base64                 bool
	remote                 string
}

// httpResponse is what a function answers: its body is text (isText) or
// body.
type httpResponse struct {
	status int
	header http.Header
	body   []byte
	text   string
	isText bool
}

// eventBody is the response's body as an event's: as it is if it is
// UTF-8, else base64.
func (r httpResponse) eventBody() (string, bool) {
	if r.isText {
		if utf8.ValidString(r.text) {
			return r.text, false
		}
		return base64.StdEncoding.EncodeToString([]byte(r.text)), true
	}
	if utf8.Valid(r.body) {
		return string(r.body), false
	}
	return base64.StdEncoding.EncodeToString(r.body), true
}

// serve runs req, made from inv's event, through the middleware: inv's
// handler answers it.
func (c *httpCore) serve(ctx context.Context, inv *invocation, req httpRequest) (httpResponse, error) {
	inv.parent = ctx
	if d, ok := ctx.Deadline(); ok {
		inv.deadline, inv.returnBy = d, d.Add(-c.before)
	}
	defer inv.end()
	var length int
	if req.base64 {
		b, err := base64.StdEncoding.DecodeString(req.body)
		if err != nil {
			return httpResponse{status: http.StatusBadRequest, header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}},
				body: []byte("the event's body is not the base64 it says it is\n")}, nil
		}
		inv.body.decoded.Reset(b)
		length = len(b)
	} else {
		inv.body.text.Reset(req.body)
		inv.body.isText, length = true, len(req.body)
	}
	if req.method == "" {
		req.method = http.MethodGet
	}
	if !validMethod(req.method) {
		return httpResponse{}, fmt.Errorf("idem/lambdaidem: the event's request: method %q", req.method)
	}
	header := req.header
	if header == nil {
		header = http.Header{}
	}
	inv.url = url.URL{Path: req.path, RawQuery: req.rawQuery}
	base := http.Request{Method: req.method, URL: &inv.url,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: header, Body: &inv.body, ContentLength: int64(length),
		Host: header.Get("Host"), RemoteAddr: req.remote}
	w := &inv.w
	w.inv, w.header = inv, make(http.Header, 4)
	c.handler.ServeHTTP(w, base.WithContext(inv))
	if inv.err != nil && w.status == http.StatusInternalServerError {
		return httpResponse{}, inv.err
	}
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.isText {
		return httpResponse{status: w.status, header: w.header, text: w.text, isText: true}, nil
	}
	return httpResponse{status: w.status, header: w.header, body: w.body.Bytes()}, nil
}

// responseBuffer is the middleware's ResponseWriter: what the response
// becomes. A body written as one string is kept as that string (isText).
type responseBuffer struct {
	inv    *invocation
	header http.Header
	status int
	body   bytes.Buffer
	text   string
	isText bool
}

func (w *responseBuffer) Header() http.Header { return w.header }
func (w *responseBuffer) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}
func (w *responseBuffer) Write(b []byte) (int, error) {
	w.toBytes()
	return w.body.Write(b)
}

func (w *responseBuffer) WriteString(s string) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.body.Len() == 0 && !w.isText {
		w.text, w.isText = s, true
		return len(s), nil
	}
	w.toBytes()
	return w.body.WriteString(s)
}

// toBytes makes the body written so far bytes, before more is written.
func (w *responseBuffer) toBytes() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.isText {
		w.body.WriteString(w.text)
		w.text, w.isText = "", false
	}
}

// responseOf is what a handler's event response says: its header fields
// written into h, its cookies as Set-Cookie fields, its body decoded.
func responseOf(h http.Header, status int, single map[string]string, multi map[string][]string, cookies []string, body string, isBase64 bool) (httpResponse, error) {
	resp := httpResponse{status: status, text: body, isText: !isBase64}
	if isBase64 {
		var err error
		if resp.body, err = base64.StdEncoding.DecodeString(body); err != nil {
			return httpResponse{}, fmt.Errorf("idem/lambdaidem: the handler's body: %w", err)
		}
		resp.text = ""
	}
	fillHeader(h, single, multi)
	for _, c := range cookies {
		h.Add("Set-Cookie", c)
	}
	return resp, nil
}

// singleHeader folds h into one value per field (the values joined with
// ", "), as the events that have only Headers carry them; Set-Cookie goes
// apart, in cookies.
func singleHeader(h http.Header) (map[string]string, []string) {
	out := make(map[string]string, len(h))
	var cookies []string
	for k, vs := range h {
		if k == "Set-Cookie" {
			cookies = append(cookies, vs...)
			continue
		}
		out[k] = strings.Join(vs, ", ")
	}
	return out, cookies
}

// headerOf makes an http.Header of an event's headers.
func headerOf(single map[string]string, multi map[string][]string, cookies []string) http.Header {
	h := make(http.Header, len(single)+len(multi)+1)
	fillHeader(h, single, multi)
	if len(cookies) > 0 {
		h.Set("Cookie", strings.Join(cookies, "; "))
	}
	return h
}

// fillHeader sets an event's header fields in h.
func fillHeader(h http.Header, single map[string]string, multi map[string][]string) {
	values := make([]string, len(single)) // one array for the single values
	i := 0
	for k, v := range single {
		values[i] = v
		h[http.CanonicalHeaderKey(k)] = values[i : i+1 : i+1]
		i++
	}
	for k, vs := range multi {
		h[http.CanonicalHeaderKey(k)] = vs
	}
}

// eventInvocation is the invocation of a handler h of events In, made
// with its event in one allocation; respond makes h's answer a response.
type eventInvocation[In, Out any] struct {
	invocation
	ev      In
	h       func(context.Context, In) (Out, error)
	respond func(hdr http.Header, out Out) (httpResponse, error)
}

func newInvocation[In, Out any](ev In, h func(context.Context, In) (Out, error), respond func(http.Header, Out) (httpResponse, error)) *eventInvocation[In, Out] {
	x := &eventInvocation[In, Out]{ev: ev, h: h, respond: respond}
	x.event, x.handler = &x.ev, x
	return x
}

func (x *eventInvocation[In, Out]) call(ctx context.Context, hdr http.Header) (httpResponse, error) {
	out, err := x.h(ctx, x.ev)
	if err != nil {
		return httpResponse{}, err
	}
	return x.respond(hdr, out)
}

func restResponse(hdr http.Header, out events.APIGatewayProxyResponse) (httpResponse, error) {
	return responseOf(hdr, out.StatusCode, out.Headers, out.MultiValueHeaders, nil, out.Body, out.IsBase64Encoded)
}

func v2Response(hdr http.Header, out events.APIGatewayV2HTTPResponse) (httpResponse, error) {
	return responseOf(hdr, out.StatusCode, out.Headers, out.MultiValueHeaders, out.Cookies, out.Body, out.IsBase64Encoded)
}

func urlResponse(hdr http.Header, out events.LambdaFunctionURLResponse) (httpResponse, error) {
	return responseOf(hdr, out.StatusCode, out.Headers, nil, out.Cookies, out.Body, out.IsBase64Encoded)
}

// APIGatewayProxy wraps the handler of a REST API's proxy integration
// (events.APIGatewayProxyRequest).
func APIGatewayProxy(cfg HTTPConfig, h func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error)) (func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error), error) {
	c, err := newHTTPCore(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		var rawQuery string
		if len(ev.QueryStringParameters) > 0 || len(ev.MultiValueQueryStringParameters) > 0 {
			q := url.Values{}
			for k, v := range ev.QueryStringParameters {
				q.Set(k, v)
			}
			for k, vs := range ev.MultiValueQueryStringParameters {
				q[k] = vs
			}
			rawQuery = q.Encode()
		}
		req := httpRequest{method: ev.HTTPMethod, path: ev.Path, rawQuery: rawQuery, header: headerOf(ev.Headers, ev.MultiValueHeaders, nil),
			body: ev.Body, base64: ev.IsBase64Encoded, remote: ev.RequestContext.Identity.SourceIP}
		resp, err := c.serve(ctx, &newInvocation(ev, h, restResponse).invocation, req)
		if err != nil {
			return events.APIGatewayProxyResponse{}, err
		}
		body, b64 := resp.eventBody()
		return events.APIGatewayProxyResponse{StatusCode: resp.status, MultiValueHeaders: resp.header, Body: body, IsBase64Encoded: b64}, nil
	}, nil
}

// APIGatewayV2 wraps the handler of an HTTP API (events.APIGatewayV2HTTPRequest,
// payload format 2.0).
func APIGatewayV2(cfg HTTPConfig, h func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error)) (func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error), error) {
	c, err := newHTTPCore(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		req := httpRequest{method: ev.RequestContext.HTTP.Method, path: ev.RawPath, rawQuery: ev.RawQueryString,
			header: headerOf(ev.Headers, nil, ev.Cookies), body: ev.Body, base64: ev.IsBase64Encoded, remote: ev.RequestContext.HTTP.SourceIP}
		resp, err := c.serve(ctx, &newInvocation(ev, h, v2Response).invocation, req)
		if err != nil {
			return events.APIGatewayV2HTTPResponse{}, err
		}
		body, b64 := resp.eventBody()
		hdr, cookies := singleHeader(resp.header)
		return events.APIGatewayV2HTTPResponse{StatusCode: resp.status, Headers: hdr, Cookies: cookies, Body: body, IsBase64Encoded: b64}, nil
	}, nil
}

// FunctionURL wraps the handler of a function URL
// (events.LambdaFunctionURLRequest, buffered).
func FunctionURL(cfg HTTPConfig, h func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error)) (func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error), error) {
	c, err := newHTTPCore(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		req := httpRequest{method: ev.RequestContext.HTTP.Method, path: ev.RawPath, rawQuery: ev.RawQueryString,
			header: headerOf(ev.Headers, nil, ev.Cookies), body: ev.Body, base64: ev.IsBase64Encoded, remote: ev.RequestContext.HTTP.SourceIP}
		resp, err := c.serve(ctx, &newInvocation(ev, h, urlResponse).invocation, req)
		if err != nil {
			return events.LambdaFunctionURLResponse{}, err
		}
		body, b64 := resp.eventBody()
		hdr, cookies := singleHeader(resp.header)
		return events.LambdaFunctionURLResponse{StatusCode: resp.status, Headers: hdr, Cookies: cookies, Body: body, IsBase64Encoded: b64}, nil
	}, nil
}

// FunctionConfig configures Function.
type FunctionConfig[In any] struct {
	// Scope names the function; keys are scoped by it. Required.
	Scope string
	// Key extracts the business key from an event. Required.
	Key func(In) (string, error)
	// Fingerprint tells events apart under one key: another fingerprint is
	// idem.ErrFingerprintMismatch, never a replay. Defaults to none: the
	// key alone decides.
	Fingerprint func(In) string
	// LeaseMargin bounds the claim by the invocation, as Config's does.
	// Defaults to 1s.
	LeaseMargin time.Duration
}

// Function makes fn idempotent for any event type, as Powertools'
// idempotent_function does: the first invocation with a key runs fn and
// stores its result (JSON); every later one with that key is answered the
// stored result without running fn. A duplicate of an invocation still in
// progress gets idem.ErrInProgress (the invocation fails, and its caller
// retries it). The claim ends at the invocation's deadline plus the
// margin.
func Function[In, Out any](g *idem.Guard, cfg FunctionConfig[In], fn func(context.Context, In) (Out, error)) (func(context.Context, In) (Out, error), error) {
	if cfg.Scope == "" || cfg.Key == nil {
		return nil, errors.New("idem/lambdaidem: FunctionConfig.Scope and FunctionConfig.Key are required")
	}
	if cfg.LeaseMargin < 0 {
		return nil, errors.New("idem/lambdaidem: FunctionConfig.LeaseMargin must not be negative")
	}
	if cfg.LeaseMargin == 0 {
		cfg.LeaseMargin = time.Second
	}
	return func(ctx context.Context, in In) (Out, error) {
		var zero Out
		id, err := cfg.Key(in)
		if err != nil {
			return zero, fmt.Errorf("idem/lambdaidem: the event's key: %w", err)
		}
		opts := &idem.RunOptions{}
		if cfg.Fingerprint != nil {
			opts.Fingerprint = cfg.Fingerprint(in)
		}
		if d, ok := ctx.Deadline(); ok {
			opts.LeaseDeadline = d.Add(cfg.LeaseMargin)
		}
		return idem.DoWith(ctx, g, idem.Key{Scope: cfg.Scope, ID: id}, opts, func(ctx context.Context) (Out, error) { return fn(ctx, in) })
	}, nil
}

// validMethod reports whether m, not empty, is an HTTP method token (RFC
// 9110), as http.NewRequest requires.
func validMethod(m string) bool {
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}
