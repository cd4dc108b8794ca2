package natsidem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// stream creates a stream and a durable consumer with unique names.
func stream(t *testing.T) (jetstream.JetStream, jetstream.Consumer, string) {
	t.Helper()
	return streamAckWait(t, 5*time.Second)
}

func streamAckWait(t *testing.T, ackWait time.Duration) (jetstream.JetStream, jetstream.Consumer, string) {
	t.Helper()
	nc, err := nats.Connect(testenv.NATSURL, nats.Timeout(3*time.Second))
	testenv.Need(t, "NATS", testenv.NATSURL, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := testenv.RandomName("IDEMTEST_")
	subject := name + ".in"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
		Durable: "worker", FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	})
	if err != nil {
		t.Fatal(err)
	}
	return js, cons, name
}

func publish(t *testing.T, js jetstream.JetStream, subject, brokerID, body string) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	m.Header.Set(nats.MsgIdHdr, brokerID) // a different broker id for every copy
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

func TestDuplicatesAckedOnce(t *testing.T) {
	js, cons, name := stream(t)
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	var runs atomic.Int32
	decisions := make(chan broker.Decision, 100)
	h, err := natsidem.GuardHandler(g, natsidem.Config{Scope: "credits", Key: broker.JSONKey("correlation_id"),
		OnDecision: func(_ jetstream.Msg, d broker.Decision) { decisions <- d }},
		func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error) {
			runs.Add(1)
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	for i := range 10 {
		publish(t, js, name+".in", fmt.Sprint("broker-", i), `{"correlation_id":"PAY-1","amount_cents":100}`)
	}
	for range 10 {
		if d := <-decisions; d.Verdict != broker.Ack {
			t.Fatalf("decision %v", d)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("work ran %d times for 10 copies", runs.Load())
	}
	// Acks are plain (not confirmed): the server counts the last ones a
	// moment later.
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := cons.Info(context.Background())
		if err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left unacked: %+v %v", info, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTransientFailureRedeliveredAndPoisonDeadLettered(t *testing.T) {
	js, cons, name := stream(t)
	ctx := context.Background()
	dlq, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "dlq", FilterSubject: name + ".dead", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s, MaxAttempts: 3})
	var mu sync.Mutex
	runs := map[string]int{}
	h, err := natsidem.GuardHandler(g, natsidem.Config{
		Scope: "credits", Key: broker.JSONKey("correlation_id"),
		Policy:            broker.Policy{BackoffMin: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
		DeadLetterSubject: name + ".dead", JetStream: js,
		OnDecision: func(m jetstream.Msg, d broker.Decision) {
			t.Logf("%s → %v %v %s", m.Data(), d.Verdict, d.Delay, d.Reason)
		},
	}, func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		id := string(msg.Data())
		runs[id]++
		if id == `{"correlation_id":"flaky"}` && runs[id] < 2 {
			return nil, errors.New("ledger timeout") // transient: released, redelivered
		}
		if id == `{"correlation_id":"broken"}` {
			return nil, errors.New("always fails")
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	publish(t, js, name+".in", "a", `{"correlation_id":"flaky"}`)
	publish(t, js, name+".in", "b", `{"correlation_id":"broken"}`)
	m, err := dlq.Next(jetstream.FetchMaxWait(15 * time.Second))
	if err != nil {
		t.Fatalf("nothing dead-lettered: %v", err)
	}
	if string(m.Data()) != `{"correlation_id":"broken"}` || m.Headers().Get(natsidem.ReasonHeader) == "" {
		t.Fatalf("dead letter %q %v", m.Data(), m.Headers())
	}
	mu.Lock()
	defer mu.Unlock()
	if runs[`{"correlation_id":"flaky"}`] != 2 || runs[`{"correlation_id":"broken"}`] != 3 {
		t.Fatalf("runs %v: the flaky message must run twice (retried after a failure), the broken one 3 times", runs)
	}
}

func TestInProgressNaksWithDelay(t *testing.T) {
	js, cons, name := stream(t)
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	// Another consumer holds the key.
	if _, err := s.Acquire(context.Background(), store.AcquireRequest{Key: g.StorageKey(idem.Key{Scope: "credits", ID: "busy"}),
		Fingerprint: idem.Fingerprint([]byte(`{"correlation_id":"busy"}`)), Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	decisions := make(chan broker.Decision, 10)
	h, _ := natsidem.GuardHandler(g, natsidem.Config{Scope: "credits", Key: broker.JSONKey("correlation_id"),
		Policy:     broker.Policy{InProgressDelay: 300 * time.Millisecond},
		OnDecision: func(_ jetstream.Msg, d broker.Decision) { decisions <- d }},
		func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error) { return nil, nil })
	cc, _ := cons.Consume(h)
	defer cc.Stop()
	publish(t, js, name+".in", "x", `{"correlation_id":"busy"}`)
	first := <-decisions
	start := time.Now()
	second := <-decisions
	if first.Verdict != broker.Retry || first.Delay != 300*time.Millisecond || second.Verdict != broker.Retry {
		t.Fatalf("decisions %v, %v", first, second)
	}
	if gap := time.Since(start); gap < 250*time.Millisecond {
		t.Fatalf("redelivered after %v, want the in-progress delay of 300ms", gap)
	}
}

// TestWorkLongerThanAckWait runs a message for three times the consumer's
// AckWait: the in-progress signals (the Guard's heartbeats for a
// GuardHandler, the handler's ticks for an InboxHandler) keep JetStream from
// redelivering it. Without them (ProgressInterval < 0) it is redelivered
// while it runs — the control that shows the test can fail.
func TestWorkLongerThanAckWait(t *testing.T) {
	const ackWait = time.Second
	for _, c := range []struct {
		name        string
		inbox       bool
		progress    time.Duration
		redelivered bool
	}{
		{"guard", false, 0, false},
		{"inbox", true, 200 * time.Millisecond, false},
		{"guard without progress", false, -1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			js, cons, name := streamAckWait(t, ackWait)
			s := memstore.New(memstore.Config{})
			defer s.Close()
			var runs atomic.Int32
			deliveries := make(chan struct{}, 10)
			work := func() {
				runs.Add(1)
				time.Sleep(3 * ackWait) // the server's AckWait runs on its own clock
			}
			cfg := natsidem.Config{Scope: "long", Key: broker.JSONKey("correlation_id"), ProgressInterval: c.progress, Concurrency: 2,
				Policy:     broker.Policy{InProgressDelay: 100 * time.Millisecond},
				OnDecision: func(jetstream.Msg, broker.Decision) { deliveries <- struct{}{} }}
			var h jetstream.MessageHandler
			var err error
			if c.inbox {
				h, err = natsidem.InboxHandler(cfg, func(ctx context.Context, msg jetstream.Msg, id string) (inbox.Outcome, error) {
					work()
					return inbox.Processed, nil
				})
			} else {
				g, _ := idem.NewGuard(idem.Config{Store: s, Lease: 600 * time.Millisecond, HeartbeatInterval: 150 * time.Millisecond})
				h, err = natsidem.GuardHandler(g, cfg, func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error) {
					work()
					return nil, nil
				})
			}
			if err != nil {
				t.Fatal(err)
			}
			cc, err := cons.Consume(h)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Stop()
			publish(t, js, name+".in", "only", `{"correlation_id":"slow"}`)
			<-deliveries // the run's decision
			info, err := cons.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := info.NumRedelivered > 0 || len(deliveries) > 0; got != c.redelivered {
				t.Fatalf("redelivered while running: %v (NumRedelivered %d, %d more decisions), want %v", got, info.NumRedelivered, len(deliveries), c.redelivered)
			}
			if !c.inbox && runs.Load() != 1 {
				t.Fatalf("ran %d times", runs.Load())
			}
		})
	}
}

// TestFingerprintChoice: by default a key reused with another payload is
// dead-lettered; with broker.NoFingerprint the key alone decides, and the
// second payload is acked as a replay.
func TestFingerprintChoice(t *testing.T) {
	for _, c := range []struct {
		name string
		fp   broker.FingerprintFunc
		want broker.Verdict
	}{{"body", nil, broker.DeadLetter}, {"none", broker.NoFingerprint, broker.Ack}} {
		t.Run(c.name, func(t *testing.T) {
			js, cons, name := stream(t)
			s := memstore.New(memstore.Config{})
			defer s.Close()
			g, _ := idem.NewGuard(idem.Config{Store: s})
			var runs atomic.Int32
			decisions := make(chan broker.Decision, 10)
			h, err := natsidem.GuardHandler(g, natsidem.Config{Scope: "credits", Key: broker.JSONKey("correlation_id"), Fingerprint: c.fp,
				OnDecision: func(_ jetstream.Msg, d broker.Decision) { decisions <- d }},
				func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error) {
					runs.Add(1)
					return nil, nil
				})
			if err != nil {
				t.Fatal(err)
			}
			cc, err := cons.Consume(h)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Stop()
			publish(t, js, name+".in", "a", `{"correlation_id":"PAY-9","amount":1}`)
			if d := <-decisions; d.Verdict != broker.Ack {
				t.Fatalf("first: %v", d)
			}
			publish(t, js, name+".in", "b", `{"correlation_id":"PAY-9","amount":2}`)
			if d := <-decisions; d.Verdict != c.want {
				t.Fatalf("same key, other payload: %v, want %v", d, c.want)
			}
			if runs.Load() != 1 {
				t.Fatalf("ran %d times", runs.Load())
			}
		})
	}
}

// TestDeadLetterCopyDropsPublishExpectations: a message published with
// JetStream's publish expectations (Nats-Expected-Stream and the others,
// Nats-Rollup, Nats-TTL) is dead-lettered: its copy carries none of them —
// the dead-letter subject's stream is another, and an expectation met by
// the original is not met by the copy, which would never be stored, the
// message redelivered for ever.
func TestDeadLetterCopyDropsPublishExpectations(t *testing.T) {
	js, cons, name := stream(t)
	ctx := context.Background()
	dead := name + "_DEAD"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: dead, Subjects: []string{dead + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), dead) })
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	decisions := make(chan broker.Decision, 16)
	h, err := natsidem.GuardHandler(g, natsidem.Config{
		Scope: "credits", Key: broker.JSONKey("correlation_id"), DeadLetterSubject: dead + ".letters", JetStream: js,
		Policy:     broker.Policy{BackoffMin: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
		OnDecision: func(_ jetstream.Msg, d broker.Decision) { decisions <- d },
	}, func(context.Context, jetstream.Msg, uint64) ([]byte, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	m := nats.NewMsg(name + ".in")
	m.Data = []byte(`{"no":"key"}`)
	m.Header.Set(nats.MsgIdHdr, "m1")
	m.Header.Set("Nats-Expected-Stream", name)
	m.Header.Set("Nats-Expected-Last-Sequence", "0")
	m.Header.Set("Idem-Original-Subject", "forged")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-decisions:
		if d.Verdict != broker.DeadLetter {
			t.Fatalf("decided %v %s, want dead-letter", d.Verdict, d.Reason)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no decision")
	}
	dlq, err := js.CreateOrUpdateConsumer(ctx, dead, jetstream.ConsumerConfig{Durable: "dlq", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	got, err := dlq.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("nothing dead-lettered: %v", err)
	}
	for k := range got.Headers() {
		if strings.HasPrefix(k, "Nats-Expected") {
			t.Errorf("the copy carries %s", k)
		}
	}
	if v := got.Headers().Get("Idem-Original-Subject"); v != name+".in" {
		t.Errorf("the copy's original subject %q, want %q", v, name+".in")
	}
}
