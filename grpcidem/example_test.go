package grpcidem_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/grpcidem"
	"github.com/idemgo/idem/store/memstore"
)

// payments is a service whose UnaryCall charges a card.
type payments struct {
	testpb.UnimplementedTestServiceServer
	charges int
}

func (p *payments) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	p.charges++
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: fmt.Appendf(nil, "charge ch_%d", p.charges)}}, nil
}

func ExampleNewServer() {
	store := memstore.New(memstore.Config{})
	defer store.Close()
	guard, err := idem.NewGuard(idem.Config{Store: store})
	if err != nil {
		panic(err)
	}
	ic, err := grpcidem.NewServer(grpcidem.Config{
		Guard:   guard,
		Methods: []string{testpb.TestService_UnaryCall_FullMethodName}, // the methods that opt in
	})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()))
	svc := &payments{}
	testpb.RegisterTestServiceServer(srv, svc)
	if err := ic.Check(srv); err != nil { // after registering: only unary methods, all known
		panic(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Stop()

	cc, _ := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	client := testpb.NewTestServiceClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		"authorization", "Bearer sk_test_alice", // the answer is alice's alone
		"idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
	for range 2 { // the client retries after a timeout, with the same key
		resp, err := client.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("amount=2500")}})
		if err != nil {
			panic(err)
		}
		fmt.Println(string(resp.GetPayload().GetBody()))
	}
	fmt.Println("charges:", svc.charges)
	// Output:
	// charge ch_1
	// charge ch_1
	// charges: 1
}

// The client side: every call through the interceptor carries one key,
// made for it, and keeps it across the retries of the service config's
// retry policy and the interceptor's own retries of ABORTED.
func ExampleUnaryClient() {
	target := "127.0.0.1:50051"
	const retryPolicy = `{"methodConfig": [{"name": [{"service": "grpc.testing.TestService"}],
		"retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
			"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	cc, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()), // or the server's TLS credentials
		grpc.WithDefaultServiceConfig(retryPolicy),               // grpc-go's own retries, e.g. of UNAVAILABLE
		grpc.WithChainUnaryInterceptor(grpcidem.UnaryClient(grpcidem.ClientConfig{})))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	_ = testpb.NewTestServiceClient(cc)
}
