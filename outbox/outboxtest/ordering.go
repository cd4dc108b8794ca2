package outboxtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/outbox"
)

// orderedMsg is message i of ordering key ok ("" for none).
func orderedMsg(ok string, i int) outbox.Message {
	m := msg(fmt.Sprintf("%s-%03d", ok, i))
	if ok == "" {
		m = msg(fmt.Sprintf("free-%03d", i))
	}
	m.OrderingKey = ok
	return m
}

// orderedSink records, per ordering key, the keys it delivered in the order
// they were delivered, and fails when two sends of one ordering key overlap.
type orderedSink struct {
	t        testing.TB
	mu       sync.Mutex
	inFlight map[string]string   // ordering key → the key being sent
	order    map[string][]string // ordering key → keys delivered
	fail     func(m *outbox.Message) outbox.Result
}

func (s *orderedSink) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	if m.OrderingKey != "" {
		s.mu.Lock()
		if other, busy := s.inFlight[m.OrderingKey]; busy {
			s.t.Errorf("%s sent while %s of the same ordering key %s was in flight", m.Key, other, m.OrderingKey)
		}
		s.inFlight[m.OrderingKey] = m.Key
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.inFlight, m.OrderingKey)
			s.mu.Unlock()
		}()
	}
	time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
	if s.fail != nil {
		if r := s.fail(m); r.Status != outbox.Sent {
			return r
		}
	}
	s.mu.Lock()
	s.order[m.OrderingKey] = append(s.order[m.OrderingKey], m.Key)
	s.mu.Unlock()
	return outbox.Result{Status: outbox.Sent}
}

func newOrderedSink(t testing.TB) *orderedSink {
	return &orderedSink{t: t, inFlight: map[string]string{}, order: map[string][]string{}}
}

// relayUntil runs relays until done says so (or 60 s pass).
func relayUntil(t *testing.T, relays []*outbox.Relay, done func() bool) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	var wg sync.WaitGroup
	for _, r := range relays {
		wg.Go(func() {
			for !done() && time.Now().Before(deadline) {
				n, err := r.RunOnce(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if n == 0 {
					time.Sleep(time.Millisecond) // rows held back by their keys, or waiting for a retry
				}
			}
		})
	}
	wg.Wait()
	if !done() {
		t.Fatal("the relays did not finish within 60 s")
	}
}

func pendingCount(t *testing.T, s *outbox.Store) int64 {
	counts, err := s.CountByStatus(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return counts[outbox.Pending]
}

// testOrderingUnderRelays: rows of three ordering keys, interleaved with
// rows of none, sent by four relays through a sender that fails a third of
// the attempts (each retried after a backoff): every key's rows are
// delivered in the order they were enqueued, never two of a key at once;
// rows without an ordering key are all delivered.
func testOrderingUnderRelays[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	const perKey = 25
	keys := []string{"acct-A", "acct-B", "acct-C"}
	for i := range perKey {
		for _, ok := range append(keys, "") {
			if err := b.Outbox.Enqueue(ctx, orderedMsg(ok, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	s := newOrderedSink(t)
	var failMu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	s.fail = func(m *outbox.Message) outbox.Result {
		failMu.Lock()
		defer failMu.Unlock()
		if rng.IntN(3) == 0 {
			return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("503")}
		}
		return outbox.Result{Status: outbox.Sent}
	}
	var relays []*outbox.Relay
	for range 4 {
		relays = append(relays, relay(t, b.Reopen().Store, s, outbox.RelayConfig{Batch: 8, Concurrency: 4, MaxTries: 1000,
			BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond}))
	}
	relayUntil(t, relays, func() bool { return pendingCount(t, b.Outbox.Store) == 0 })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ok := range keys {
		got := s.order[ok]
		if len(got) != perKey {
			t.Fatalf("%s: %d rows delivered, want %d", ok, len(got), perKey)
		}
		for i, k := range got {
			if want := fmt.Sprintf("%s-%03d", ok, i); k != want {
				t.Fatalf("%s: delivered %v; row %d is %s, want %s", ok, got, i, k, want)
			}
		}
	}
	if n := len(s.order[""]); n != perKey {
		t.Fatalf("%d rows without an ordering key delivered, want %d", n, perKey)
	}
}

// testDeadRowBlocksItsKey: a dead row holds back the later rows of its
// ordering key — listed as blocked by it — and only those; Skip moves the
// key on; Retry sends the dead row again, then the rows behind it.
func testDeadRowBlocksItsKey[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	for i := range 3 {
		for _, ok := range []string{"acct-A", "acct-B", "acct-C"} {
			if err := b.Outbox.Enqueue(ctx, orderedMsg(ok, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	refuse := map[string]bool{"acct-A-000": true, "acct-C-001": true}
	s := newOrderedSink(t)
	var mu sync.Mutex
	s.fail = func(m *outbox.Message) outbox.Result {
		mu.Lock()
		defer mu.Unlock()
		if refuse[m.Key] {
			return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("422: refused")}
		}
		return outbox.Result{Status: outbox.Sent}
	}
	r := relay(t, b.Outbox.Store, s, outbox.RelayConfig{Batch: 4})
	drain := func() {
		for {
			n, err := r.RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
		}
	}
	drain()
	status := func(key string) outbox.Row {
		row, err := b.Outbox.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return row
	}
	for key, want := range map[string]outbox.Status{
		"acct-A-000": outbox.Dead, "acct-A-001": outbox.Pending, "acct-A-002": outbox.Pending,
		"acct-B-000": outbox.Sent, "acct-B-001": outbox.Sent, "acct-B-002": outbox.Sent,
		"acct-C-000": outbox.Sent, "acct-C-001": outbox.Dead, "acct-C-002": outbox.Pending,
	} {
		if got := status(key); got.Status != want {
			t.Fatalf("%s is %s, want %s", key, got.Status, want)
		}
	}
	rows, err := b.Outbox.List(ctx, outbox.Pending, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	blocked := map[string]string{}
	for _, row := range rows {
		blocked[row.Key] = row.BlockedBy
	}
	if blocked["acct-A-001"] != "acct-A-000" || blocked["acct-A-002"] != "acct-A-000" || blocked["acct-C-002"] != "acct-C-001" {
		t.Fatalf("pending rows blocked by %v", blocked)
	}
	if row := status("acct-A-001"); row.BlockedBy != "acct-A-000" {
		t.Fatalf("Get: acct-A-001 blocked by %q", row.BlockedBy)
	}

	if err := b.Outbox.Skip(ctx, "acct-A-000"); err != nil {
		t.Fatal(err)
	}
	if err := b.Outbox.Skip(ctx, "acct-B-000"); err == nil {
		t.Fatal("a sent row was skipped")
	}
	mu.Lock()
	delete(refuse, "acct-C-001")
	mu.Unlock()
	if err := b.Outbox.Retry(ctx, "acct-C-001"); err != nil {
		t.Fatal(err)
	}
	drain()
	if got := status("acct-A-000"); got.Status != outbox.Skipped {
		t.Fatalf("the skipped row is %s", got.Status)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if got := fmt.Sprint(s.order["acct-A"]); got != "[acct-A-001 acct-A-002]" {
		t.Fatalf("acct-A after the skip: %s", got)
	}
	if got := fmt.Sprint(s.order["acct-C"]); got != "[acct-C-000 acct-C-001 acct-C-002]" {
		t.Fatalf("acct-C after the retry: %s", got)
	}
}

// testDeadRowReleasesItsKey: with RelayConfig.DeadRowsReleaseOrderingKeys,
// the rows behind a dead row are sent.
func testDeadRowReleasesItsKey[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	for i := range 3 {
		if err := b.Outbox.Enqueue(ctx, orderedMsg("acct-A", i)); err != nil {
			t.Fatal(err)
		}
	}
	s := newOrderedSink(t)
	s.fail = func(m *outbox.Message) outbox.Result {
		if m.Key == "acct-A-000" {
			return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("422: refused")}
		}
		return outbox.Result{Status: outbox.Sent}
	}
	r := relay(t, b.Outbox.Store, s, outbox.RelayConfig{DeadRowsReleaseOrderingKeys: true})
	for {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	if got := fmt.Sprint(s.order["acct-A"]); got != "[acct-A-001 acct-A-002]" {
		t.Fatalf("delivered %s past the dead row", got)
	}
}

// blockingSender sends every message at once except those named in hold,
// whose sends wait for release after saying so on started.
type blockingSender struct {
	hold    string
	started chan string
	release chan struct{}
	mu      sync.Mutex
	sent    []string
}

func (s *blockingSender) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	if m.Key == s.hold {
		s.started <- m.Key
		<-s.release
	}
	s.mu.Lock()
	s.sent = append(s.sent, m.Key)
	s.mu.Unlock()
	return outbox.Result{Status: outbox.Sent}
}

// testRefusedRowWaitsForItsKey: A and B share an ordering key. A is sent;
// B is claimed and its send is under way when A's receipt refuses it (A is
// pending again). Another relay must not claim A while B's send is under
// way — two rows of one key in flight at once —, and sends A once B's
// claim is over. (Found by the outbox's protocol model, internal/model.)
func testRefusedRowWaitsForItsKey[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	a, bb := orderedMsg("acct", 1), orderedMsg("acct", 2)
	for _, m := range []outbox.Message{a, bb} {
		if err := b.Outbox.Enqueue(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	first := &blockingSender{hold: bb.Key, started: make(chan string, 1), release: make(chan struct{})}
	r1, err := outbox.NewRelay(outbox.RelayConfig{Store: b.Outbox.Store, Sender: first, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r1.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("the first batch: %d, %v; want A alone", n, err)
	}
	done := make(chan error, 1)
	go func() { _, err := r1.RunOnce(ctx); done <- err }()
	<-first.started // B's send is under way
	if err := b.Outbox.Refuse(ctx, a.Key, "refused by the receiver", false); err != nil {
		t.Fatal(err)
	}
	second := &blockingSender{started: make(chan string, 1)}
	r2, err := outbox.NewRelay(outbox.RelayConfig{Store: b.Outbox.Store, Sender: second, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r2.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("another relay while B's send is under way: %d rows (%v), sent %v; want none: A would be in flight beside B", n, err, second.sent)
	}
	close(first.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, err := r2.RunOnce(ctx); err != nil || n != 1 || len(second.sent) != 1 || second.sent[0] != a.Key {
		t.Fatalf("after B's send: %d rows (%v), sent %v; want A", n, err, second.sent)
	}
}
