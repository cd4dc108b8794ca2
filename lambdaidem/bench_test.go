package lambdaidem_test

import (
	"context"
	"strconv"
	"strings"
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
// invocation a replay of one key. With new keys the store holds a steady
// number of records, as a store whose records expire does: each key is
// forgotten (Delete, counted in) steadyRecords invocations after its own —
// a store that only grew would make the garbage collector's share per
// invocation grow with the benchmark's length.
func BenchmarkAPIGatewayProxy(b *testing.B) {
	const steadyRecords = 10_000
	for _, mode := range []string{"new-key", "replay"} {
		b.Run(mode, func(b *testing.B) {
			s := memstore.New(memstore.Config{})
			defer s.Close()
			h, err := lambdaidem.APIGatewayProxy(lambdaidem.HTTPConfig{HTTP: httpidem.Config{Store: s}}, benchHandler)
			if err != nil {
				b.Fatal(err)
			}
			ev := restEvent(`"k-0"`, "Bearer alice", `{"sku":"A1"}`)
			// As the Lambda runtime gives it: the invocation's deadline.
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			prefix := storagePrefix(b, s, h, ctx, ev)
			i := 0
			defer reportCPU(b)()
			for b.Loop() {
				if mode == "new-key" {
					i++
					ev.Headers["Idempotency-Key"] = `"k-` + strconv.Itoa(i) + `"`
					if i > steadyRecords {
						if err := s.Delete(ctx, prefix+strconv.Itoa(i-steadyRecords)); err != nil {
							b.Fatal(err)
						}
					}
				}
				if resp, err := h(ctx, ev); err != nil || resp.StatusCode != 201 {
					b.Fatalf("%d %v", resp.StatusCode, err)
				}
			}
		})
	}
}

// storagePrefix runs ev (key "k-0") once and returns the storage key of its
// record less "0": the storage key of key "k-N" is the prefix and N. The
// record is deleted.
func storagePrefix(b *testing.B, s *memstore.Store, h func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error), ctx context.Context, ev events.APIGatewayProxyRequest) string {
	if resp, err := h(ctx, ev); err != nil || resp.StatusCode != 201 {
		b.Fatalf("%d %v", resp.StatusCode, err)
	}
	recs, err := s.List(ctx, "", 2)
	if err != nil || len(recs) != 1 || !strings.HasSuffix(recs[0].Key, "k-0") {
		b.Fatalf("%v %v", recs, err)
	}
	if err := s.Delete(ctx, recs[0].Key); err != nil {
		b.Fatal(err)
	}
	return strings.TrimSuffix(recs[0].Key, "0")
}
