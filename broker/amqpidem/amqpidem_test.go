package amqpidem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/memstore"
)

// queue declares a queue dead-lettering into queue+".dead" and returns a
// channel to publish on and one to consume from.
func queue(t *testing.T) (*amqp.Channel, *amqp.Channel, string) {
	t.Helper()
	conn, err := amqp.DialConfig(testenv.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	testenv.Need(t, "RabbitMQ", testenv.AMQPURL, err)
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.RandomName("idemtest.")
	if _, err := ch.QueueDeclare(name+".dead", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, false, true, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": name + ".dead",
	}); err != nil {
		t.Fatal(err)
	}
	consume, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := consume.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	return ch, consume, name
}

func publish(t *testing.T, ch *amqp.Channel, q, msgID, corr, body string) {
	t.Helper()
	if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
		MessageId: msgID, CorrelationId: corr, Body: []byte(body),
	}); err != nil {
		t.Fatal(err)
	}
}

func TestAMQPAdapter(t *testing.T) {
	ch, consumeCh, q := queue(t)
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s, MaxAttempts: 3})
	var mu sync.Mutex
	runs := map[string]int{}
	decisions := make(chan string, 100)
	h, err := amqpidem.GuardHandler(g, amqpidem.Config{
		Scope: "credits", Key: amqpidem.CorrelationIDKey,
		Policy: broker.Policy{BackoffMin: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
		OnDecision: func(d *amqp.Delivery, dec broker.Decision) {
			decisions <- d.CorrelationId + " " + dec.Verdict.String()
		},
	}, func(ctx context.Context, d *amqp.Delivery, fence uint64) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		runs[d.CorrelationId]++
		switch {
		case d.CorrelationId == "flaky" && runs["flaky"] == 1:
			return nil, errors.New("timeout")
		case d.CorrelationId == "broken":
			return nil, errors.New("always")
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consumeErr := make(chan error, 1)
	go func() { consumeErr <- amqpidem.Consume(ctx, consumeCh, q, "", h) }()
	for i := range 5 {
		publish(t, ch, q, fmt.Sprint("m-", i), "PAY-1", "credit 100")
	}
	publish(t, ch, q, "m-f", "flaky", "x")
	publish(t, ch, q, "m-b", "broken", "y")
	// Wait for: 5 acks of PAY-1, flaky retried then acked, broken dead-lettered.
	want := map[string]bool{"PAY-1 ack": false, "flaky ack": false, "broken dead-letter": false}
	deadline := time.After(20 * time.Second)
	acks := 0
	for !(want["PAY-1 ack"] && want["flaky ack"] && want["broken dead-letter"] && acks == 5) {
		select {
		case d := <-decisions:
			if d == "PAY-1 ack" {
				acks++
			}
			want[d] = true
		case err := <-consumeErr:
			t.Fatalf("Consume ended: %v", err)
		case <-deadline:
			t.Fatalf("decisions so far: %v, PAY-1 acks %d", want, acks)
		}
	}
	mu.Lock()
	if runs["PAY-1"] != 1 || runs["flaky"] != 2 || runs["broken"] != 3 {
		t.Errorf("runs %v", runs)
	}
	mu.Unlock()
	// The broker routes the rejected message to the dead-letter queue
	// asynchronously.
	var dl amqp.Delivery
	var ok bool
	for end := time.Now().Add(5 * time.Second); !ok && err == nil && time.Now().Before(end); {
		if dl, ok, err = ch.Get(q+".dead", true); !ok {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err != nil || !ok || dl.CorrelationId != "broken" {
		t.Fatalf("dead-letter queue: %v %v %q", ok, err, dl.CorrelationId)
	}
}

// TestMessageIDKey: keyed on the message-id — where idem's outbox sender
// writes its key, the same on every retry — two copies of one message run
// once, and a message without a message-id is dead-lettered, never run.
func TestMessageIDKey(t *testing.T) {
	ch, consumeCh, q := queue(t)
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	var mu sync.Mutex
	runs := map[string]int{}
	decisions := make(chan broker.Decision, 10)
	h, err := amqpidem.GuardHandler(g, amqpidem.Config{
		Scope: "credits", Key: amqpidem.MessageIDKey,
		OnDecision: func(d *amqp.Delivery, dec broker.Decision) { decisions <- dec },
	}, func(ctx context.Context, d *amqp.Delivery, fence uint64) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		runs[d.MessageId]++
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = amqpidem.Consume(ctx, consumeCh, q, "", h) }()
	publish(t, ch, q, "TRF-1", "", "credit 100")
	publish(t, ch, q, "TRF-1", "", "credit 100") // the relay's resend
	publish(t, ch, q, "", "PAY-9", "credit 5")   // no message-id
	got := map[string]int{}
	for range 3 {
		select {
		case d := <-decisions:
			got[d.Verdict.String()]++
			if d.Verdict == broker.DeadLetter && !strings.Contains(d.Reason, "no message-id") {
				t.Errorf("dead-lettered for %q, want no message-id", d.Reason)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("decisions so far: %v", got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got["ack"] != 2 || got["dead-letter"] != 1 || runs["TRF-1"] != 1 || len(runs) != 1 {
		t.Errorf("decisions %v, runs %v; want 2 acks, 1 dead letter, TRF-1 run once and nothing else", got, runs)
	}
}

// TestTracing: with Config.TracerProvider, a delivery is processed in a
// consumer span whose parent is the producer's span from the traceparent
// header, the Guard's work runs in it, and the span carries the verdict.
func TestTracing(t *testing.T) {
	ch, consumeCh, q := queue(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	worked := make(chan trace.SpanContext, 1)
	h, err := amqpidem.GuardHandler(g, amqpidem.Config{Scope: "credits", Key: amqpidem.MessageIDKey, TracerProvider: tp},
		func(ctx context.Context, d *amqp.Delivery, fence uint64) ([]byte, error) {
			worked <- trace.SpanContextFromContext(ctx)
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = amqpidem.Consume(ctx, consumeCh, q, "", h) }()
	const producer = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{MessageId: "PAY-1", Body: []byte("credit"),
		Headers: amqp.Table{"traceparent": producer}}); err != nil {
		t.Fatal(err)
	}
	var in trace.SpanContext
	select {
	case in = <-worked:
	case <-time.After(10 * time.Second):
		t.Fatal("not processed")
	}
	testenv.Eventually(t, 5*time.Second, "the consumer span ended", func() error {
		if len(exp.GetSpans()) == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	span := exp.GetSpans()[0]
	if span.Name != "process "+q || span.SpanKind != trace.SpanKindConsumer || span.Parent.SpanID().String() != "00f067aa0ba902b7" ||
		span.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || in.SpanID() != span.SpanContext.SpanID() {
		t.Fatalf("span %s (%v), parent %s, trace %s; the work ran in %s", span.Name, span.SpanKind, span.Parent.SpanID(), span.SpanContext.TraceID(), in.SpanID())
	}
}
