package grpcidem_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/grpcidem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// service is the business: UnaryCall opted in, CacheableUnaryCall not.
type service struct {
	testpb.UnimplementedTestServiceServer
	runs    atomic.Int32
	started chan struct{} // told when a call starts, if set
	release chan struct{} // a call returns once it is closed, if set
}

func (s *service) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	n := s.runs.Add(1)
	if s.started != nil {
		s.started <- struct{}{}
	}
	if s.release != nil {
		<-s.release
	}
	body := string(req.GetPayload().GetBody())
	if body == "empty order" {
		st, _ := status.New(codes.InvalidArgument, "the order has no lines").WithDetails(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "lines", Description: "at least one"}}})
		return nil, st.Err()
	}
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: fmt.Appendf(nil, "%s: run %d", body, n)}}, nil
}

func (s *service) CacheableUnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return s.UnaryCall(ctx, req)
}

// dropFirst loses the first response of each method after the handler
// ran: the client sees UNAVAILABLE, as when a connection breaks on the way
// back. It records every attempt's key.
type dropFirst struct {
	mu   sync.Mutex
	seen map[string]bool
	keys []string
}

func (d *dropFirst) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	d.mu.Lock()
	d.keys = append(d.keys, strings.Join(md.Get(grpcidem.KeyMetadata), ","))
	first := !d.seen[info.FullMethod]
	d.seen[info.FullMethod] = true
	d.mu.Unlock()
	resp, err := handler(ctx, req)
	if first {
		return nil, status.Error(codes.Unavailable, "the response was lost on the way")
	}
	return resp, err
}

// retryPolicy retries UNAVAILABLE, as a client configured for a flaky
// network does.
const retryPolicy = `{"methodConfig": [{"name": [{"service": "grpc.testing.TestService"}],
  "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`

type fixture struct {
	inProgress atomic.Int32 // acquisitions that found the key in progress
	svc        *service
	attempts   chan string // every call's key, as it reaches the server
	faults     *dropFirst
	client     testpb.TestServiceClient // through grpcidem's client interceptor and the retry policy
	raw        testpb.TestServiceClient // no interceptor, no retries
}

func start(t *testing.T, faults bool, cfg grpcidem.Config) *fixture {
	t.Helper()
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	f := &fixture{svc: &service{}, faults: &dropFirst{seen: map[string]bool{}}, attempts: make(chan string, 64)}
	g, err := idem.NewGuard(idem.Config{Store: s, Observer: func(e idem.Event) {
		if e.Phase == "acquire" && e.Outcome == store.InProgress {
			f.inProgress.Add(1)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Guard = g
	if cfg.Methods == nil {
		cfg.Methods = []string{testpb.TestService_UnaryCall_FullMethodName}
	}
	ic, err := grpcidem.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	chain := []grpc.UnaryServerInterceptor{ic.Unary()}
	if faults {
		chain = append([]grpc.UnaryServerInterceptor{f.faults.unary}, chain...)
	}
	chain = append([]grpc.UnaryServerInterceptor{func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		select {
		case f.attempts <- strings.Join(md.Get(grpcidem.KeyMetadata), ","):
		default:
		}
		return handler(ctx, req)
	}}, chain...)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	testpb.RegisterTestServiceServer(srv, f.svc)
	if err := ic.Check(srv); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	dial := func(opts ...grpc.DialOption) testpb.TestServiceClient {
		cc, err := grpc.NewClient(ln.Addr().String(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return testpb.NewTestServiceClient(cc)
	}
	f.client = dial(grpc.WithDefaultServiceConfig(retryPolicy),
		grpc.WithChainUnaryInterceptor(grpcidem.UnaryClient(grpcidem.ClientConfig{Methods: []string{testpb.TestService_UnaryCall_FullMethodName}})))
	f.raw = dial(grpc.WithDisableRetry())
	return f
}

func caller(key string) context.Context {
	md := metadata.Pairs("authorization", "Bearer token-of-alice")
	if key != "" {
		md.Append(grpcidem.KeyMetadata, key)
	}
	return metadata.NewOutgoingContext(context.Background(), md)
}

func order(body string) *testpb.SimpleRequest {
	return &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte(body)}}
}

// TestLostResponseIsReplayed: the first response is lost after the handler
// ran; grpc-go's retry policy sends the call again with the key the client
// interceptor made, and gets the first run's answer: the handler ran once.
func TestLostResponseIsReplayed(t *testing.T) {
	f := start(t, true, grpcidem.Config{})
	resp, err := f.client.UnaryCall(caller(""), order("order 1"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(resp.GetPayload().GetBody()); got != "order 1: run 1" || f.svc.runs.Load() != 1 {
		t.Fatalf("got %q after %d runs, want the first run's answer after one run", got, f.svc.runs.Load())
	}
	f.faults.mu.Lock()
	defer f.faults.mu.Unlock()
	if len(f.faults.keys) != 2 || f.faults.keys[0] == "" || f.faults.keys[0] != f.faults.keys[1] {
		t.Fatalf("the attempts carried keys %q, want one key twice", f.faults.keys)
	}
}

// TestStatusReplayedExactly: a refusal with details is stored, and a retry
// gets the same status, its details byte for byte, without a second run.
func TestStatusReplayedExactly(t *testing.T) {
	f := start(t, false, grpcidem.Config{})
	_, first := f.raw.UnaryCall(caller("ORD-2"), order("empty order"))
	_, again := f.raw.UnaryCall(caller("ORD-2"), order("empty order"))
	a, b := status.Convert(first).Proto(), status.Convert(again).Proto()
	ab, _ := proto.Marshal(a)
	bb, _ := proto.Marshal(b)
	if a.GetCode() != int32(codes.InvalidArgument) || len(a.GetDetails()) != 1 || string(ab) != string(bb) || f.svc.runs.Load() != 1 {
		t.Fatalf("first %v, replay %v, %d runs", a, b, f.svc.runs.Load())
	}
}

// TestDuplicateInFlight: a call whose key is in progress gets ABORTED with
// a RetryInfo; the client interceptor waits what it asks, retries with the
// same key, and gets the first call's answer once it is done.
func TestDuplicateInFlight(t *testing.T) {
	f := start(t, false, grpcidem.Config{RetryDelay: 20 * time.Millisecond})
	f.svc.started, f.svc.release = make(chan struct{}, 1), make(chan struct{})
	firstDone := make(chan *testpb.SimpleResponse, 1)
	go func() {
		resp, err := f.raw.UnaryCall(caller("ORD-3"), order("order 3"))
		if err != nil {
			t.Error(err)
		}
		firstDone <- resp
	}()
	<-f.svc.started
	_, err := f.raw.UnaryCall(caller("ORD-3"), order("order 3"))
	st := status.Convert(err)
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		retry, _ = d.(*errdetails.RetryInfo)
	}
	if st.Code() != codes.Aborted || retry == nil || retry.GetRetryDelay().AsDuration() != 20*time.Millisecond {
		t.Fatalf("a duplicate in flight got %v (details %v)", st, st.Details())
	}
	waited := make(chan *testpb.SimpleResponse, 1)
	go func() {
		resp, err := f.client.UnaryCall(caller("ORD-3"), order("order 3"))
		if err != nil {
			t.Error(err)
		}
		waited <- resp
	}()
	// The raw call, the raw duplicate, then the client's call and its
	// retry after the ABORTED: the first run is released only then.
	for range 4 {
		if k := <-f.attempts; k != "ORD-3" {
			t.Fatalf("an attempt with key %q", k)
		}
	}
	close(f.svc.release)
	first, second := <-firstDone, <-waited
	if string(first.GetPayload().GetBody()) != "order 3: run 1" || !proto.Equal(first, second) || f.svc.runs.Load() != 1 {
		t.Fatalf("first %v, the waiting duplicate %v, %d runs", first, second, f.svc.runs.Load())
	}
}

// TestKeyReusedWithAnotherRequest: FAILED_PRECONDITION, nothing runs.
func TestKeyReusedWithAnotherRequest(t *testing.T) {
	f := start(t, false, grpcidem.Config{})
	if _, err := f.raw.UnaryCall(caller("ORD-4"), order("order 4")); err != nil {
		t.Fatal(err)
	}
	_, err := f.raw.UnaryCall(caller("ORD-4"), order("order 4, changed"))
	if status.Code(err) != codes.FailedPrecondition || f.svc.runs.Load() != 1 {
		t.Fatalf("another request under the key: %v after %d runs", err, f.svc.runs.Load())
	}
}

// TestUntouched: a method that did not opt in, a call without a key, and a
// call without a principal run every time.
func TestUntouched(t *testing.T) {
	f := start(t, false, grpcidem.Config{})
	for range 2 {
		if _, err := f.raw.CacheableUnaryCall(caller("ORD-5"), order("order 5")); err != nil {
			t.Fatal(err)
		}
		if _, err := f.raw.UnaryCall(caller(""), order("order 6")); err != nil {
			t.Fatal(err)
		}
		anonymous := metadata.NewOutgoingContext(context.Background(), metadata.Pairs(grpcidem.KeyMetadata, "ORD-7"))
		if _, err := f.raw.UnaryCall(anonymous, order("order 7")); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.svc.runs.Load(); n != 6 {
		t.Fatalf("%d runs, want 6", n)
	}
}

// TestPrincipalsApart: two callers under one key each get their own run.
func TestPrincipalsApart(t *testing.T) {
	f := start(t, false, grpcidem.Config{})
	bob := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer token-of-bob", grpcidem.KeyMetadata, "ORD-8"))
	a, err1 := f.raw.UnaryCall(caller("ORD-8"), order("order 8"))
	b, err2 := f.raw.UnaryCall(bob, order("order 8"))
	if err1 != nil || err2 != nil || proto.Equal(a, b) || f.svc.runs.Load() != 2 {
		t.Fatalf("alice %v (%v), bob %v (%v), %d runs", a, err1, b, err2, f.svc.runs.Load())
	}
}

// TestConfigRefused: a streaming method, or a method the server lacks,
// cannot opt in; nor can an interceptor start without methods.
func TestConfigRefused(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	if _, err := grpcidem.NewServer(grpcidem.Config{Guard: g}); err == nil {
		t.Error("an interceptor without methods")
	}
	ic, err := grpcidem.NewServer(grpcidem.Config{Guard: g, Methods: []string{testpb.TestService_StreamingOutputCall_FullMethodName, "/grpc.testing.TestService/Nope"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()))
	testpb.RegisterTestServiceServer(srv, &service{})
	err = ic.Check(srv)
	if err == nil || !strings.Contains(err.Error(), "streaming method") || !strings.Contains(err.Error(), "Nope is not a method") {
		t.Fatalf("Check: %v", err)
	}
}

// TestDuplicatesWaitForTheFirst: with Config.WaitInProgress, concurrent
// calls under one key through a client that does not retry: one run, every
// other call answered with its response, none waiting past the bound.
func TestDuplicatesWaitForTheFirst(t *testing.T) {
	const bound = 5 * time.Second
	f := start(t, false, grpcidem.Config{WaitInProgress: bound})
	f.svc.started, f.svc.release = make(chan struct{}, 1), make(chan struct{})
	first := make(chan *testpb.SimpleResponse, 1)
	go func() {
		resp, err := f.raw.UnaryCall(caller("ORD-9"), order("order 9"))
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	<-f.svc.started
	var wg sync.WaitGroup
	var same atomic.Int32
	var longest atomic.Int64
	answers := make(chan *testpb.SimpleResponse, 20)
	for range 20 {
		wg.Go(func() {
			start := time.Now()
			resp, err := f.raw.UnaryCall(caller("ORD-9"), order("order 9"))
			longest.Store(max(longest.Load(), int64(time.Since(start))))
			if err != nil {
				t.Error(err)
				return
			}
			answers <- resp
		})
	}
	for f.inProgress.Load() < 20 { // every duplicate found the key in progress, and waits
		runtime.Gosched()
	}
	close(f.svc.release)
	wg.Wait()
	close(answers)
	want := <-first
	for a := range answers {
		if proto.Equal(a, want) {
			same.Add(1)
		}
	}
	if f.svc.runs.Load() != 1 || same.Load() != 20 || time.Duration(longest.Load()) > bound {
		t.Fatalf("%d runs, %d of 20 got the first answer, the longest wait %v", f.svc.runs.Load(), same.Load(), time.Duration(longest.Load()))
	}
}
