package lambdaidem_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/internal/cputime"
	"github.com/idemgo/idem/lambdaidem"
	"github.com/idemgo/idem/store/memstore"
)

func benchHandler(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
	return events.APIGatewayProxyResponse{StatusCode: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: `{"order":1}`}, nil
}

// BenchmarkBareHandler is the handler alone: what the wrapper adds to.
func BenchmarkBareHandler(b *testing.B) {
	ev := restEvent(`"k"`, "Bearer alice", `{"sku":"A1"}`)
	defer reportCPU(b)()
	for b.Loop() {
		_, _ = benchHandler(context.Background(), ev)
	}
}

// reportCPU starts counting the process's CPU time (every thread: the
// garbage collector's work included); the function it returns reports it
// per operation, as cpu-ns/op.
func reportCPU(b *testing.B) func() {
	start, ok := cputime.Process()
	return func() {
		if end, _ := cputime.Process(); ok && b.N > 0 {
			b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

// BenchmarkAPIGatewayProxy is the wrapped handler on the memory store,
// each invocation under a context with a deadline as the runtime gives:
// every invocation a new key (a claim, the handler, a settle), and every
// invocation a replay of one key.
func BenchmarkAPIGatewayProxy(b *testing.B) {
	for _, mode := range []string{"new-key", "replay"} {
		b.Run(mode, func(b *testing.B) {
			s := memstore.New(memstore.Config{})
			defer s.Close()
			h, err := lambdaidem.APIGatewayProxy(lambdaidem.HTTPConfig{HTTP: httpidem.Config{Store: s}}, benchHandler)
			if err != nil {
				b.Fatal(err)
			}
			ev := restEvent(`"k"`, "Bearer alice", `{"sku":"A1"}`)
			// As the Lambda runtime gives it: the invocation's deadline.
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			i := 0
			defer reportCPU(b)()
			for b.Loop() {
				if mode == "new-key" {
					i++
					ev.Headers["Idempotency-Key"] = `"k-` + strconv.Itoa(i) + `"`
				}
				if resp, err := h(ctx, ev); err != nil || resp.StatusCode != 201 {
					b.Fatalf("%d %v", resp.StatusCode, err)
				}
			}
		})
	}
}
