package watermillidem_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/watermillidem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// run routes the messages through mw into a handler that fails the first
// attempt of "flaky", and returns how often each key's handler ran. It
// waits for want runs (however long the machine takes), then 300ms more in
// which a run beyond them would show.
func run(t *testing.T, mw message.HandlerMiddleware, msgs []*message.Message, want int) map[string]int {
	t.Helper()
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	done := make(chan struct{}, 100)
	router.AddConsumerHandler("credits", "payments", pubsub, func(m *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		id := m.Metadata.Get("correlation_id")
		runs[id]++
		done <- struct{}{}
		if id == "flaky" && runs[id] == 1 {
			return errors.New("ledger timeout")
		}
		return nil
	})
	router.AddMiddleware(mw)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go router.Run(ctx)
	<-router.Running()
	for _, m := range msgs {
		if err := pubsub.Publish("payments", m); err != nil {
			t.Fatal(err)
		}
	}
	for n := 0; n < want; n++ {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of the %d runs expected", n, want)
		}
	}
	// More runs than expected would come now, if at all.
	for quiet := time.After(300 * time.Millisecond); ; {
		select {
		case <-done:
			continue
		case <-quiet:
		}
		break
	}
	_ = router.Close()
	mu.Lock()
	defer mu.Unlock()
	out := map[string]int{}
	for k, v := range runs {
		out[k] = v
	}
	return out
}

func messages() []*message.Message {
	var out []*message.Message
	for _, id := range []string{"PAY-1", "PAY-1", "flaky", "PAY-1"} {
		m := message.NewMessage(watermill.NewUUID(), []byte("credit "+id)) // a new broker id per copy
		m.Metadata.Set("correlation_id", id)
		out = append(out, m)
	}
	return out
}

func TestRetriesAfterFailureUnlikeDeduplicator(t *testing.T) {
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	mw, err := watermillidem.Middleware(g, "credits", broker.HeaderKey("correlation_id"))
	if err != nil {
		t.Fatal(err)
	}
	runs := run(t, mw, messages(), 3) // PAY-1 once, flaky twice
	if runs["PAY-1"] != 1 || runs["flaky"] != 2 {
		t.Fatalf("idem: runs %v; want PAY-1 once and flaky twice (its redelivery after the failure runs)", runs)
	}

	// Watermill's Deduplicator, same stream: the failed message's redelivery
	// is dropped — the instruction is never booked.
	d := &middleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.Metadata.Get("correlation_id"), nil }}
	wm := run(t, d.Middleware, messages(), 2) // PAY-1 once, flaky once
	if wm["flaky"] != 1 {
		t.Fatalf("watermill Deduplicator: runs %v (this test documents that it drops the retry)", wm)
	}
	t.Logf("after a failed first attempt: idem ran the redelivery (%d runs), Watermill's Deduplicator dropped it (%d run)", runs["flaky"], wm["flaky"])
}

// TestHandlerGetsTheGuardContext: the handler sees the fence in
// m.Context(), and its context ends when the lease is lost (here: a
// store that refuses the heartbeat because another owner took the key).
func TestHandlerGetsTheGuardContext(t *testing.T) {
	st := memstore.New(memstore.Config{})
	defer st.Close()
	g, err := idem.NewGuard(idem.Config{Store: st, Lease: 300 * time.Millisecond, HeartbeatInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := watermillidem.Middleware(g, "credits", broker.HeaderKey("correlation_id"))
	if err != nil {
		t.Fatal(err)
	}
	m := message.NewMessage(watermill.NewUUID(), []byte("credit 10"))
	m.Metadata.Set("correlation_id", "PAY-ctx")
	type ctxKey struct{}
	m.SetContext(context.WithValue(context.Background(), ctxKey{}, "router"))
	var fence uint64
	var lost error
	_, err = mw(func(m *message.Message) ([]*message.Message, error) {
		f, ok := idem.FenceFrom(m.Context())
		if !ok || f == 0 {
			t.Error("no fence in the handler's context")
		}
		fence = f
		// Another owner deletes the record and claims the key: the next
		// heartbeat is refused and the handler's context ends.
		skey := g.StorageKey(idem.Key{Scope: "credits", ID: "PAY-ctx"})
		if err := st.Delete(context.Background(), skey); err != nil {
			t.Error(err)
		}
		if _, err := st.Acquire(context.Background(), store.AcquireRequest{Key: skey, Fingerprint: "other", Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Error(err)
		}
		select {
		case <-m.Context().Done():
			lost = context.Cause(m.Context())
		case <-time.After(5 * time.Second):
			t.Error("the handler's context outlived the lost lease")
		}
		return nil, lost
	})(m)
	if err == nil || lost == nil {
		t.Fatalf("the lost lease reached neither the handler (%v) nor the router (%v)", lost, err)
	}
	if fence == 0 || m.Context().Value(ctxKey{}) != "router" {
		t.Fatal("the message's own context was not given back")
	}
}

// TestTracing: WithTracerProvider processes a message in a consumer span
// whose parent is the producer's span from the traceparent metadata; the
// handler runs in it.
func TestTracing(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	mw, err := watermillidem.Middleware(g, "credits", broker.HeaderKey("correlation_id"), watermillidem.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	var in trace.SpanContext
	h := mw(func(m *message.Message) ([]*message.Message, error) {
		in = trace.SpanContextFromContext(m.Context())
		return nil, nil
	})
	m := message.NewMessage("m-1", []byte("credit"))
	m.Metadata.Set("correlation_id", "PAY-1")
	m.Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if _, err := h(m); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	span := spans[0]
	if span.SpanKind != trace.SpanKindConsumer || span.Parent.SpanID().String() != "00f067aa0ba902b7" ||
		span.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || in.SpanID() != span.SpanContext.SpanID() {
		t.Fatalf("span %s (%v), parent %s; the handler ran in %s", span.Name, span.SpanKind, span.Parent.SpanID(), in.SpanID())
	}
}
