package e2e_test

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/natssender"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

var traceSVG = flag.String("trace.svg", "", "write the traced request's spans as an SVG waterfall to this file (docs/trace.svg)")

// TestOneTrace: an HTTP request enqueues a transfer in its transaction
// (EnqueueTx records the request's span); the relay sends it to JetStream
// in a span that is the request span's child and links to it, and writes
// its context into the message's headers; natsidem's consumer continues
// that trace, and the inbox books the transfer in it. One trace id from the
// request to the booking.
func TestOneTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	ctx := context.Background()
	pool, schema := testenv.PostgresSchema(t, func(s string) string {
		return `CREATE TABLE ` + s + `.debits (key text PRIMARY KEY, cents bigint NOT NULL);
			CREATE TABLE ` + s + `.credits (key text PRIMARY KEY, cents bigint NOT NULL)`
	})
	ob, err := outbox.New(pgxv5.New(pool), outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(pgxv5.New(pool), inbox.Config{Table: schema + ".processed_events", VersionTable: schema + ".entity_versions", TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	js := jetStream(t, testenv.NATSURL)
	stream := testenv.RandomName("IDEMTRACE_")
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	subject := stream + ".transfers"

	// The service: POST /transfers debits and enqueues in one transaction,
	// in the span of the request (continued from the caller's headers).
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tp.Tracer("api").Start(ctx, "POST /transfers", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		body, _ := io.ReadAll(r.Body)
		var tr transfer
		_ = json.Unmarshal(body, &tr)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.debits (key, cents) VALUES ($1, $2)`, tr.Key, tr.Cents); err != nil {
				return err
			}
			return ob.EnqueueTx(ctx, tx, outbox.Message{Key: tr.Key, Destination: testenv.NATSURL + "/" + subject, Payload: body})
		})
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer api.Close()

	// The consumer: natsidem into the inbox, booking the credit.
	booked := make(chan struct{})
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "credits", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	h, err := natsidem.InboxHandler(natsidem.Config{Scope: "credits", Key: broker.HeaderKey(nats.MsgIdHdr), TracerProvider: tp},
		func(ctx context.Context, msg jetstream.Msg, id string) (inbox.Outcome, error) {
			out, err := ib.Process(ctx, inbox.Event{Consumer: "credits", CorrelationID: id}, func(ctx context.Context, tx pgx.Tx) error {
				var tr transfer
				if err := json.Unmarshal(msg.Data(), &tr); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.credits (key, cents) VALUES ($1, $2)`, tr.Key, tr.Cents)
				return err
			})
			if err == nil && out == inbox.Processed {
				close(booked)
			}
			return out, err
		})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	// The caller's request, in a trace of its own.
	callerCtx, caller := tp.Tracer("client").Start(ctx, "checkout", trace.WithSpanKind(trace.SpanKindClient))
	req, _ := http.NewRequestWithContext(callerCtx, http.MethodPost, api.URL+"/transfers", strings.NewReader(`{"key":"TRF-1","account":"ACC-1","cents":2500}`))
	propagation.TraceContext{}.Inject(callerCtx, propagation.HeaderCarrier(req.Header))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /transfers: %v %v", resp, err)
	}
	resp.Body.Close()
	caller.End()

	relay, err := outbox.NewRelay(outbox.RelayConfig{Store: ob.Store, Sender: natssender.New(), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("relayed %d: %v", n, err)
	}
	select {
	case <-booked:
	case <-time.After(10 * time.Second):
		t.Fatal("the transfer was not booked")
	}
	testenv.Eventually(t, 5*time.Second, "the consumer's span ended", func() error {
		for _, s := range exp.GetSpans().Snapshots() {
			if strings.HasPrefix(s.Name(), "process ") {
				return nil
			}
		}
		return io.EOF
	})

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range exp.GetSpans().Snapshots() {
		spans[s.Name()] = s
		if s.SpanContext().TraceID() != caller.SpanContext().TraceID() {
			t.Errorf("span %q is in trace %s, not the caller's %s", s.Name(), s.SpanContext().TraceID(), caller.SpanContext().TraceID())
		}
	}
	request, send, process, book := spans["POST /transfers"], spans["send "+subject], spans["process "+subject], spans["idem.inbox.process"]
	if request == nil || send == nil || process == nil || book == nil {
		t.Fatalf("spans %v", names(exp.GetSpans().Snapshots()))
	}
	parent := func(child, of sdktrace.ReadOnlySpan) {
		t.Helper()
		if child.Parent().SpanID() != of.SpanContext().SpanID() {
			t.Errorf("%q's parent is not %q", child.Name(), of.Name())
		}
	}
	parent(send, request)
	parent(process, send)
	parent(book, process)
	if links := send.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != request.SpanContext().SpanID() {
		t.Errorf("the send's links %v, want the request span", links)
	}
	if send.SpanKind() != trace.SpanKindProducer || process.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("kinds: send %v, process %v", send.SpanKind(), process.SpanKind())
	}
	want := map[string]map[string]string{
		"send":    {"messaging.system": "nats", "messaging.destination.name": subject, "messaging.message.id": "TRF-1", "messaging.operation.type": "send"},
		"process": {"messaging.system": "nats", "messaging.destination.name": subject, "messaging.message.id": "TRF-1", "messaging.operation.type": "process"},
		"book":    {"idem.consumer": "credits", "idem.outcome": "processed"},
	}
	for name, span := range map[string]sdktrace.ReadOnlySpan{"send": send, "process": process, "book": book} {
		got := map[string]string{}
		for _, kv := range span.Attributes() {
			got[string(kv.Key)] = kv.Value.String()
		}
		for k, v := range want[name] {
			if got[k] != v {
				t.Errorf("%s span: %s = %q, want %q", name, k, got[k], v)
			}
		}
	}
	if *traceSVG != "" {
		if err := os.WriteFile(*traceSVG, waterfall(exp.GetSpans().Snapshots()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}
