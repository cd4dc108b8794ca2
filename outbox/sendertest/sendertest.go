// Package sendertest is the conformance suite of outbox senders: every
// transport (HTTP, NATS, AMQP, AS2) runs it against a real receiver.
//
// The suite checks what the relay relies on:
//   - every attempt carries the same key, in the protocol's own field, and
//     the same bytes;
//   - a receiver's "duplicate" answer to a retry counts as delivered
//     (where the protocol has one: Features.DuplicateAnswer);
//   - a destination that cannot be reached now is retried (Pending), never
//     dead;
//   - a destination refused for good (malformed, or rejected by the
//     receiver) is dead at once, with the reason;
//   - many concurrent sends, each delivered with its own key.
package sendertest

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/outbox"
)

// Delivery is one copy of a message as the receiver got it.
type Delivery struct {
	// KeyField is the value of the protocol's dedup field.
	KeyField string
	Payload  []byte
}

// Features declares what a transport's receiver can do.
type Features struct {
	// DuplicateAnswer: the receiver tells a sender that a retry is a
	// duplicate of a delivered message (JetStream's duplicate PubAck, an
	// Idempotency-Key server's replay).
	DuplicateAnswer bool
	// ReceiverDedups: the receiver keeps one copy of a retried message
	// (JetStream's duplicate window); otherwise it receives every attempt.
	ReceiverDedups bool
}

// Target is one transport under test.
type Target struct {
	Sender   outbox.Sender
	Features Features
	// Destination returns a fresh destination on a real receiver, and what
	// it has received so far. With Features.DuplicateAnswer the receiver
	// answers a retry of a delivered key as a duplicate.
	Destination func(t *testing.T) (dest string, received func() []Delivery)
	// KeyField is the value the protocol's dedup field must carry for key.
	KeyField func(key string) string
	// Unreachable is a destination whose server does not answer now.
	Unreachable func(t *testing.T) string
	// Refused are destinations refused for good: malformed, or rejected
	// by the receiver.
	Refused func(t *testing.T) []string
	// Stress is how many messages the concurrent case sends. Defaults to
	// 200.
	Stress int
}

// Run runs every case against target.
func Run(t *testing.T, target Target) {
	if target.Stress <= 0 {
		target.Stress = 200
	}
	t.Run("SameKeyAndBytesOnEveryAttempt", func(t *testing.T) { testSameKey(t, target) })
	if target.Features.DuplicateAnswer {
		t.Run("DuplicateAnswerIsDelivered", func(t *testing.T) { testDuplicate(t, target) })
	}
	t.Run("UnreachableIsRetried", func(t *testing.T) { testUnreachable(t, target) })
	t.Run("RefusedIsDead", func(t *testing.T) { testRefused(t, target) })
	t.Run("ConcurrentSends", func(t *testing.T) { testConcurrent(t, target) })
}

func delivered(st outbox.Status) bool { return st == outbox.Sent || st == outbox.Acked }

// waitFor polls received until cond holds (the receiver is another
// process: a broker, a server; nothing signals its arrival to the test).
func waitFor(t *testing.T, received func() []Delivery, cond func([]Delivery) bool) []Delivery {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := received()
		if cond(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the receiver got %d deliveries, not what the case expects", len(got))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testSameKey(t *testing.T, target Target) {
	dest, received := target.Destination(t)
	m := &outbox.Message{Key: "ORD-20261130-0001", Destination: dest, Payload: []byte("order 1\x00\xffbinary"),
		Headers: map[string]string{"Date": "Mon, 30 Nov 2026 09:00:00 GMT"}}
	const attempts = 3 // the first, then two retries after lost answers
	for i := range attempts {
		if res := target.Sender.Send(context.Background(), m); !delivered(res.Status) {
			t.Fatalf("attempt %d: %s (%v)", i+1, res.Status, res.Err)
		}
	}
	want := attempts
	if target.Features.ReceiverDedups {
		want = 1
	}
	got := waitFor(t, received, func(d []Delivery) bool { return len(d) >= want })
	if len(got) != want {
		t.Fatalf("the receiver holds %d copies, want %d", len(got), want)
	}
	for i, d := range got {
		if d.KeyField != target.KeyField(m.Key) || !bytes.Equal(d.Payload, m.Payload) {
			t.Fatalf("copy %d: key field %q, payload %q; want %q, %q", i, d.KeyField, d.Payload, target.KeyField(m.Key), m.Payload)
		}
	}
}

func testDuplicate(t *testing.T, target Target) {
	dest, _ := target.Destination(t)
	m := &outbox.Message{Key: "ORD-20261130-0002", Destination: dest, Payload: []byte("order 2")}
	first := target.Sender.Send(context.Background(), m)
	if !delivered(first.Status) {
		t.Fatalf("first attempt: %s (%v)", first.Status, first.Err)
	}
	again := target.Sender.Send(context.Background(), m)
	if !delivered(again.Status) || again.Err == nil {
		t.Fatalf("the retry of a delivered message: %s (%v); want delivered, saying why", again.Status, again.Err)
	}
}

func testUnreachable(t *testing.T, target Target) {
	m := &outbox.Message{Key: "ORD-20261130-0003", Destination: target.Unreachable(t), Payload: []byte("order 3")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res := target.Sender.Send(ctx, m); res.Status != outbox.Pending || res.Err == nil {
		t.Fatalf("unreachable destination: %s (%v); want pending with the cause", res.Status, res.Err)
	}
}

func testRefused(t *testing.T, target Target) {
	for _, dest := range target.Refused(t) {
		m := &outbox.Message{Key: "ORD-20261130-0004", Destination: dest, Payload: []byte("order 4")}
		if res := target.Sender.Send(context.Background(), m); res.Status != outbox.Dead || res.Err == nil {
			t.Errorf("%s: %s (%v); want dead with the reason", dest, res.Status, res.Err)
		}
	}
}

func testConcurrent(t *testing.T, target Target) {
	dest, received := target.Destination(t)
	var wg sync.WaitGroup
	errs := make(chan error, target.Stress)
	sem := make(chan struct{}, 32)
	for i := range target.Stress {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			m := &outbox.Message{Key: fmt.Sprintf("K-%05d", i), Destination: dest, Payload: fmt.Appendf(nil, "payload %05d", i)}
			if res := target.Sender.Send(context.Background(), m); !delivered(res.Status) {
				errs <- fmt.Errorf("%s: %s (%v)", m.Key, res.Status, res.Err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := waitFor(t, received, func(d []Delivery) bool { return len(d) >= target.Stress })
	seen := map[string]bool{}
	for _, d := range got {
		var i int
		if _, err := fmt.Sscanf(string(d.Payload), "payload %05d", &i); err != nil {
			t.Fatalf("a payload that was not sent: %q", d.Payload)
		}
		if want := target.KeyField(fmt.Sprintf("K-%05d", i)); d.KeyField != want {
			t.Fatalf("payload %d arrived with key field %q, want %q", i, d.KeyField, want)
		}
		seen[d.KeyField] = true
	}
	if len(got) != target.Stress || len(seen) != target.Stress {
		t.Fatalf("%d deliveries of %d keys, want %d of %d", len(got), len(seen), target.Stress, target.Stress)
	}
}
