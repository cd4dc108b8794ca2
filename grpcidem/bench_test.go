package grpcidem_test

import (
	"context"
	"net"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/grpcidem"
	"github.com/idemgo/idem/store/memstore"
)

// BenchmarkUnary measures a unary call over loopback, side by side: with
// no interceptor, through grpcidem with a new key on every call (the
// execute path: a claim, the handler, a settle on the memory store), and
// with one key (the replay path: a claim answered with the stored
// response). Both servers reuse their goroutines (grpc.NumStreamWorkers):
// on a goroutine per call, the guarded path's deeper calls grow each new
// goroutine's stack (runtime.newstack took 15% of a replay's CPU), a cost
// of the deployment's choice rather than of the interceptor. Run:
// go test -run x -bench Unary -benchmem ./grpcidem
func BenchmarkUnary(b *testing.B) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, err := idem.NewGuard(idem.Config{Store: s})
	if err != nil {
		b.Fatal(err)
	}
	ic, err := grpcidem.NewServer(grpcidem.Config{Guard: g, Methods: []string{testpb.TestService_UnaryCall_FullMethodName}})
	if err != nil {
		b.Fatal(err)
	}
	serve := func(opts ...grpc.ServerOption) testpb.TestServiceClient {
		srv := grpc.NewServer(opts...)
		testpb.RegisterTestServiceServer(srv, &service{})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go func() { _ = srv.Serve(ln) }()
		b.Cleanup(srv.Stop)
		cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		return testpb.NewTestServiceClient(cc)
	}
	bare, guarded := serve(grpc.NumStreamWorkers(4)), serve(grpc.NumStreamWorkers(4), grpc.UnaryInterceptor(ic.Unary()))
	req := order("order")
	ns := map[string]float64{}
	run := func(name string, client testpb.TestServiceClient, key func(i int) string) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				md := metadata.Pairs("authorization", "Bearer token-of-alice")
				if k := key(i); k != "" {
					md.Append(grpcidem.KeyMetadata, k)
				}
				if _, err := client.UnaryCall(metadata.NewOutgoingContext(context.Background(), md), req); err != nil {
					b.Fatal(err)
				}
			}
			ns[name] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
	}
	run("bare", bare, func(int) string { return "" })
	run("execute", guarded, func(i int) string { return "ORD-" + strconv.Itoa(i) })
	run("replay", guarded, func(int) string { return "ORD-REPLAYED" })
	if ns["bare"] > 0 {
		b.Logf("per call: bare %.0f ns; execute %.2fx; replay %.2fx", ns["bare"], ns["execute"]/ns["bare"], ns["replay"]/ns["bare"])
	}
}
