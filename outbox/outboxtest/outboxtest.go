package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/sqldriver"
)

// Backend is one database under test, reached through a driver whose
// transactions are of type TTx.
type Backend[TTx any] struct {
	// Outbox is migrated, on tables of its own.
	Outbox *outbox.Outbox[TTx]
	Driver sqldriver.Driver[TTx]
	// Reopen returns a second Outbox on the same tables (another process).
	Reopen func() *outbox.Outbox[TTx]
	// Config is the Outbox's configuration (its schema), for outboxes the
	// suite opens on drivers of its own.
	Config outbox.Config
}

// begin starts a transaction; end commits (true) or rolls back.
func (b Backend[TTx]) begin(ctx context.Context) (tx TTx, end func(commit bool) error, err error) {
	tx, err = b.Driver.Begin(ctx)
	if err != nil {
		return tx, nil, err
	}
	return tx, func(commit bool) error {
		if commit {
			return b.Driver.Commit(ctx, tx)
		}
		return b.Driver.Rollback(ctx, tx)
	}, nil
}

// Run runs every case, each on a fresh backend from open.
func Run[TTx any](t *testing.T, open func(t testing.TB) Backend[TTx]) {
	cases := []struct {
		name string
		fn   func(t *testing.T, b Backend[TTx])
	}{
		{"EnqueueIsIdempotent", testEnqueue[TTx]},
		{"EnqueueTxJoinsTheTransaction", testEnqueueTx[TTx]},
		{"BadMessagesRefused", testBad[TTx]},
		{"KeysFromAPersistedCounter", testKeys[TTx]},
		{"RelaySendsWithTheKey", testRelaySends[TTx]},
		{"FailuresBackOffThenDie", testFailures[TTx]},
		{"RetryAndAck", testRetryAck[TTx]},
		{"AsynchronousReceipts", testAsyncReceipts[TTx]},
		{"TwoRelaysNeverSendAClaimedRowTwice", testTwoRelays[TTx]},
		{"ExpiredClaimIsRetried", testExpiredClaim[TTx]},
		{"PurgeDeliveredOnly", testPurge[TTx]},
		{"AckDuringSendIsKept", testAckDuringSend[TTx]},
		{"SlowBatchNeverOutlivesItsClaim", testSlowBatch[TTx]},
		{"ClaimOutlivesASendThatIgnoresItsTimeout", testClaimOutlivesSend[TTx]},
		{"RenewalNeverRevivesALostClaim", testRenewalAfterLoss[TTx]},
		{"OrderingKeysSentInOrderUnderFourRelays", testOrderingUnderRelays[TTx]},
		{"DeadRowBlocksItsOrderingKeyOnly", testDeadRowBlocksItsKey[TTx]},
		{"DeadRowReleasesItsOrderingKeyWhenConfigured", testDeadRowReleasesItsKey[TTx]},
		{"RefusedRowWaitsForItsKey", testRefusedRowWaitsForItsKey[TTx]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, open(t))
		})
	}
}

func msg(key string) outbox.Message {
	return outbox.Message{Key: key, Destination: "test://sink", Payload: []byte("payload of " + key), Headers: map[string]string{"X-Trace": key}}
}

func testEnqueue[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	if err := b.Outbox.Enqueue(ctx, msg("k1")); err != nil {
		t.Fatal(err)
	}
	if err := b.Outbox.Enqueue(ctx, msg("k1")); err != nil {
		t.Fatalf("same key, same payload: %v", err)
	}
	other := msg("k1")
	other.Payload = []byte("another payload")
	if err := b.Outbox.Enqueue(ctx, other); !errors.Is(err, outbox.ErrKeyReused) {
		t.Fatalf("same key, other payload: %v, want ErrKeyReused", err)
	}
	r, err := b.Outbox.Get(ctx, "k1")
	if err != nil || r.Status != outbox.Pending || string(r.Payload) != "payload of k1" || r.Headers["X-Trace"] != "k1" || r.CreatedAt.IsZero() {
		t.Fatalf("row %+v, %v", r, err)
	}
}

func testEnqueueTx[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	tx, end, err := b.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Outbox.EnqueueTx(ctx, tx, msg("rolled-back")); err != nil {
		t.Fatal(err)
	}
	if err := end(false); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Outbox.Get(ctx, "rolled-back"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("a rolled-back enqueue is in the outbox: %v", err)
	}
	tx, end, _ = b.begin(ctx)
	key, err := b.Outbox.NextKeyTx(ctx, tx, "ORD", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Outbox.EnqueueTx(ctx, tx, msg(key)); err != nil {
		t.Fatal(err)
	}
	if err := end(true); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Outbox.Get(ctx, key); err != nil {
		t.Fatalf("committed enqueue: %v", err)
	}
}

func testBad[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	for name, m := range map[string]outbox.Message{
		"empty key":      {Destination: "test://x"},
		"long key":       {Key: strings.Repeat("k", 300), Destination: "test://x"},
		"key with CRLF":  {Key: "a\r\nInjected: 1", Destination: "test://x"},
		"no destination": {Key: "k"},
		"no scheme":      {Key: "k", Destination: "sink"},
		"20MB payload":   {Key: "k", Destination: "test://x", Payload: make([]byte, 20<<20)},
	} {
		if err := b.Outbox.Enqueue(ctx, m); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if rows, _ := b.Outbox.List(ctx, "", 0, 10); len(rows) != 0 {
		t.Fatalf("refused messages stored: %d rows", len(rows))
	}
}

func testKeys[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	day := time.Date(2026, 5, 14, 23, 59, 0, 0, time.UTC)
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tx, end, err := b.begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			k, err := b.Outbox.NextKeyTx(ctx, tx, "ORD", day)
			if err != nil {
				end(false)
				t.Error(err)
				return
			}
			if err := end(true); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			seen[k] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	for i := 1; i <= 20; i++ {
		if k := fmt.Sprintf("ORD-20260514-%04d", i); !seen[k] {
			t.Fatalf("missing key %s in %v", k, seen)
		}
	}
	// Persisted: another store (process) continues the sequence.
	other := b.Reopen()
	k, err := other.NextKey(ctx, "ORD", day)
	if err != nil || k != "ORD-20260514-0021" {
		t.Fatalf("after a restart: %q %v", k, err)
	}
	if k, _ := other.NextKey(ctx, "ORD", day.Add(time.Minute)); k != "ORD-20260515-0001" {
		t.Fatalf("next day: %q", k)
	}
	u1, _ := outbox.NewUUIDKey()
	u2, _ := outbox.NewUUIDKey()
	if len(u1) != 36 || u1 == u2 || u1[14] != '7' {
		t.Fatalf("UUIDv7 keys %q %q", u1, u2)
	}
}

// sink records what it was sent.
type sink struct {
	mu      sync.Mutex
	got     map[string][][]byte
	fail    func(m *outbox.Message, attempt int) outbox.Result
	delay   time.Duration
	entered chan struct{} // if set, told when a send starts
	release chan struct{} // if set, a send returns only once it is closed
}

func newSink() *sink { return &sink{got: map[string][][]byte{}} }

func (s *sink) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	s.mu.Lock()
	s.got[m.Key] = append(s.got[m.Key], append([]byte(nil), m.Payload...))
	n := len(s.got[m.Key])
	s.mu.Unlock()
	if s.entered != nil {
		select {
		case s.entered <- struct{}{}:
		default:
		}
	}
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	if s.release != nil {
		<-s.release
	}
	if s.fail != nil {
		return s.fail(m, n)
	}
	return outbox.Result{Status: outbox.Sent}
}

func (s *sink) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got[key])
}

func relay(t *testing.T, store *outbox.Store, s outbox.Sender, cfg outbox.RelayConfig) *outbox.Relay {
	cfg.Store, cfg.Sender = store, s
	r, err := outbox.NewRelay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func testRelaySends[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	for i := range 5 {
		if err := b.Outbox.Enqueue(ctx, msg(fmt.Sprint("m", i))); err != nil {
			t.Fatal(err)
		}
	}
	s := newSink()
	r := relay(t, b.Outbox.Store, outbox.Router{"test": s}, outbox.RelayConfig{Batch: 3})
	total := 0
	for {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	if total != 5 {
		t.Fatalf("relayed %d, want 5", total)
	}
	for i := range 5 {
		k := fmt.Sprint("m", i)
		row, _ := b.Outbox.Get(ctx, k)
		if s.count(k) != 1 || row.Status != outbox.Sent || row.Tries != 1 || row.SentAt.IsZero() {
			t.Fatalf("%s: sent %d times, row %+v", k, s.count(k), row)
		}
	}
	// An unknown scheme is dead at once.
	if err := b.Outbox.Enqueue(ctx, outbox.Message{Key: "x", Destination: "carrier-pigeon://roof"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if row, _ := b.Outbox.Get(ctx, "x"); row.Status != outbox.Dead || !strings.Contains(row.LastError, "no sender") {
		t.Fatalf("unknown scheme: %+v", row)
	}
}

func testFailures[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	if err := b.Outbox.Enqueue(ctx, msg("flaky")); err != nil {
		t.Fatal(err)
	}
	s := newSink()
	s.fail = func(m *outbox.Message, attempt int) outbox.Result {
		return outbox.Result{Status: outbox.Pending, Err: fmt.Errorf("503 on attempt %d", attempt)}
	}
	r := relay(t, b.Outbox.Store, s, outbox.RelayConfig{MaxTries: 3, BackoffMin: 10 * time.Millisecond, BackoffMax: 40 * time.Millisecond})
	for attempt := 1; attempt <= 3; attempt++ {
		deadline := time.Now().Add(5 * time.Second)
		for s.count("flaky") < attempt {
			if _, err := r.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("attempt %d never came", attempt)
			}
			time.Sleep(5 * time.Millisecond)
		}
		row, _ := b.Outbox.Get(ctx, "flaky")
		if row.Tries != attempt || !strings.Contains(row.LastError, fmt.Sprint("attempt ", attempt)) {
			t.Fatalf("after attempt %d: %+v", attempt, row)
		}
		if attempt < 3 && (row.Status != outbox.Pending || row.NextAttemptAt.After(time.Now().Add(time.Second))) {
			t.Fatalf("after attempt %d: %+v (want pending, retry within the backoff bound)", attempt, row)
		}
	}
	row, _ := b.Outbox.Get(ctx, "flaky")
	if row.Status != outbox.Dead {
		t.Fatalf("after MaxTries: %s", row.Status)
	}
	s.mu.Lock()
	for _, p := range s.got["flaky"] {
		if string(p) != "payload of flaky" {
			t.Fatalf("an attempt carried other bytes: %q", p)
		}
	}
	s.mu.Unlock()
	// A Dead answer stops at once.
	if err := b.Outbox.Enqueue(ctx, msg("rejected")); err != nil {
		t.Fatal(err)
	}
	s.fail = func(*outbox.Message, int) outbox.Result {
		return outbox.Result{Status: outbox.Dead, Err: errors.New("400: unknown product")}
	}
	r.RunOnce(ctx)
	if row, _ := b.Outbox.Get(ctx, "rejected"); row.Status != outbox.Dead || row.Tries != 1 || row.LastError != "400: unknown product" {
		t.Fatalf("rejected: %+v", row)
	}
	if st, err := b.Outbox.Stats(ctx); err != nil || st.Dead != 2 {
		t.Fatalf("stats %+v %v", st, err)
	}
}

func testRetryAck[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	b.Outbox.Enqueue(ctx, msg("d"))
	s := newSink()
	s.fail = func(*outbox.Message, int) outbox.Result {
		return outbox.Result{Status: outbox.Dead, Err: errors.New("no")}
	}
	r := relay(t, b.Outbox.Store, s, outbox.RelayConfig{})
	r.RunOnce(ctx)
	if err := b.Outbox.Retry(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if err := b.Outbox.Retry(ctx, "d"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("retry of a pending message: %v", err)
	}
	s.fail = nil
	r.RunOnce(ctx)
	row, _ := b.Outbox.Get(ctx, "d")
	if row.Status != outbox.Sent || row.Tries != 2 {
		t.Fatalf("after retry: %+v", row)
	}
	if err := b.Outbox.Ack(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if row, _ := b.Outbox.Get(ctx, "d"); row.Status != outbox.Acked || row.AckedAt.IsZero() {
		t.Fatalf("after ack: %+v", row)
	}
	if err := b.Outbox.Ack(ctx, "absent"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("ack of an unknown key: %v", err)
	}
	if st, _ := b.Outbox.Stats(ctx); st.Pending != 0 || !st.OldestPending.IsZero() {
		t.Fatalf("stats %+v", st)
	}
}

// testAsyncReceipts: a row sent under an external id (an AS2 Message-ID)
// is found by it when its receipt arrives; a refused receipt sends it again
// or makes it dead; only a sent row is refused.
func testAsyncReceipts[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	for _, k := range []string{"e1", "e2"} {
		m := msg(k)
		m.ExternalID = "<" + k + "@idem.as2>"
		if err := b.Outbox.Enqueue(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Outbox.GetByExternalID(ctx, "<nobody@idem.as2>"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("an unknown external id: %v", err)
	}
	if err := b.Outbox.Refuse(ctx, "e1", "not sent yet", false); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("refusing a pending row: %v", err)
	}
	// A receipt acks only a sent row: a pending one was never delivered.
	if err := b.Outbox.AckSent(ctx, "e1"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("a receipt acking a pending row: %v", err)
	}
	if row, _ := b.Outbox.Get(ctx, "e1"); row.Status != outbox.Pending {
		t.Fatalf("a pending row after a receipt: %+v", row)
	}
	s := newSink()
	r := relay(t, b.Outbox.Store, s, outbox.RelayConfig{})
	r.RunOnce(ctx)
	row, err := b.Outbox.GetByExternalID(ctx, "<e1@idem.as2>")
	if err != nil || row.Key != "e1" || row.Status != outbox.Sent || row.ExternalID != "<e1@idem.as2>" {
		t.Fatalf("by external id: %+v, %v", row, err)
	}
	// A refused receipt: sent again at once, with the reason kept.
	if err := b.Outbox.Refuse(ctx, "e1", "the MDN's MIC differs", false); err != nil {
		t.Fatal(err)
	}
	if row, _ := b.Outbox.Get(ctx, "e1"); row.Status != outbox.Pending || row.LastError != "the MDN's MIC differs" {
		t.Fatalf("after a refused receipt: %+v", row)
	}
	r.RunOnce(ctx)
	if s.count("e1") != 2 {
		t.Fatalf("e1 sent %d times, want 2", s.count("e1"))
	}
	// A hopeless one: dead. An acked row is never refused.
	if err := b.Outbox.Refuse(ctx, "e2", "decryption-failed", true); err != nil {
		t.Fatal(err)
	}
	if row, _ := b.Outbox.Get(ctx, "e2"); row.Status != outbox.Dead {
		t.Fatalf("after a hopeless receipt: %+v", row)
	}
	if err := b.Outbox.AckSent(ctx, "e2"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("a receipt acking a dead row: %v", err)
	}
	r.RunOnce(ctx) // e1 sent again
	if err := b.Outbox.AckSent(ctx, "e1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Outbox.AckSent(ctx, "e1"); err != nil {
		t.Fatalf("the same receipt again: %v", err)
	}
	if row, _ := b.Outbox.Get(ctx, "e1"); row.Status != outbox.Acked {
		t.Fatalf("after its receipt: %+v", row)
	}
	if err := b.Outbox.Refuse(ctx, "e1", "late", false); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("refusing an acked row: %v", err)
	}
}

func testTwoRelays[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	const n = 200
	for i := range n {
		if err := b.Outbox.Enqueue(ctx, msg(fmt.Sprint("r", i))); err != nil {
			t.Fatal(err)
		}
	}
	s := newSink()
	s.delay = time.Millisecond
	var wg sync.WaitGroup
	for range 2 {
		r := relay(t, b.Outbox.Store, s, outbox.RelayConfig{Batch: 10, Concurrency: 4})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k, err := r.RunOnce(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if k == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	for i := range n {
		if c := s.count(fmt.Sprint("r", i)); c != 1 {
			t.Fatalf("r%d sent %d times by two relays", i, c)
		}
	}
}

func testExpiredClaim[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	b.Outbox.Enqueue(ctx, msg("orphan"))
	// A relay claims and freezes mid-send (a stopped VM, a long pause): it
	// neither sends on nor renews its claim, and its database statements
	// wait until it thaws.
	frozen := &freezable[TTx]{Driver: b.Driver, thawed: make(chan struct{})}
	close(frozen.thawed)
	dyingOutbox, err := outbox.New[TTx](frozen, b.Config)
	if err != nil {
		t.Fatal(err)
	}
	stuck := newSink()
	stuck.entered = make(chan struct{}, 1)
	stuck.release = make(chan struct{})
	dying := relay(t, dyingOutbox.Store, stuck, outbox.RelayConfig{Lease: time.Second, SendTimeout: 500 * time.Millisecond})
	dyingDone := make(chan struct{})
	go func() { dying.RunOnce(ctx); close(dyingDone) }()
	<-stuck.entered // claimed and sending
	frozen.freeze()
	s := newSink()
	r := relay(t, b.Outbox.Store, s, outbox.RelayConfig{})
	if n, _ := r.RunOnce(ctx); n != 0 {
		t.Fatal("a claimed row was claimed again before its lease expired")
	}
	// Once the frozen relay's lease (1s, plus at most one renewal made
	// before it froze) is over, another relay takes the row.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the frozen relay's row was never claimed again")
		}
	}
	if s.count("orphan") != 1 {
		t.Fatal("the orphan was not sent")
	}
	frozen.thaw()
	close(stuck.release)
	<-dyingDone // the frozen relay's late result must not overwrite
	if row, _ := b.Outbox.Get(ctx, "orphan"); row.Status != outbox.Sent || row.Tries != 1 {
		t.Fatalf("row %+v", row)
	}
}

// freezable is a driver whose statements wait while it is frozen.
type freezable[TTx any] struct {
	sqldriver.Driver[TTx]
	mu     sync.Mutex
	thawed chan struct{} // closed while not frozen
	execs  chan struct{} // if set, told when an Exec returns
}

func (f *freezable[TTx]) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.thawed = make(chan struct{})
}

func (f *freezable[TTx]) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.thawed)
}

func (f *freezable[TTx]) wait() {
	f.mu.Lock()
	c := f.thawed
	f.mu.Unlock()
	<-c
}

func (f *freezable[TTx]) Executor() sqldriver.Executor {
	return freezingExecutor{f.wait, f.Driver.Executor(), f.execs}
}

type freezingExecutor struct {
	wait  func()
	ex    sqldriver.Executor
	execs chan struct{}
}

func (e freezingExecutor) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	e.wait()
	n, err := e.ex.Exec(ctx, q, args...)
	if e.execs != nil {
		select {
		case e.execs <- struct{}{}:
		default:
		}
	}
	return n, err
}

func (e freezingExecutor) Query(ctx context.Context, q string, args ...any) (sqldriver.Rows, error) {
	e.wait()
	return e.ex.Query(ctx, q, args...)
}

func (e freezingExecutor) QueryRow(ctx context.Context, q string, args ...any) sqldriver.Row {
	e.wait()
	return e.ex.QueryRow(ctx, q, args...)
}

func testPurge[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	for _, k := range []string{"done-1", "done-2", "fails"} {
		b.Outbox.Enqueue(ctx, msg(k))
	}
	s := newSink()
	s.fail = func(m *outbox.Message, _ int) outbox.Result {
		if m.Key == "fails" {
			return outbox.Result{Status: outbox.Dead, Err: errors.New("no")}
		}
		return outbox.Result{Status: outbox.Sent}
	}
	relay(t, b.Outbox.Store, s, outbox.RelayConfig{}).RunOnce(ctx)
	b.Outbox.Enqueue(ctx, msg("waiting"))
	if n, err := b.Outbox.Purge(ctx, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("purge of recent rows: %d %v", n, err)
	}
	time.Sleep(20 * time.Millisecond)
	if n, err := b.Outbox.Purge(ctx, 10*time.Millisecond, 10); err != nil || n != 2 {
		t.Fatalf("purge: %d %v, want the 2 delivered rows", n, err)
	}
	for k, want := range map[string]bool{"done-1": false, "fails": true, "waiting": true} {
		if _, err := b.Outbox.Get(ctx, k); (err == nil) != want {
			t.Errorf("%s kept = %v, want %v", k, err == nil, want)
		}
	}
}

// testAckDuringSend: a receipt (an MDN, a business ack) that lands while a
// relay holds the row is final: neither the relay's failed attempt nor its
// success may turn acked back into pending or sent.
func testAckDuringSend[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	for _, k := range []string{"ack-then-fail", "ack-then-sent"} {
		if err := b.Outbox.Enqueue(ctx, msg(k)); err != nil {
			t.Fatal(err)
		}
	}
	entered, proceed := make(chan string, 2), make(chan struct{})
	s := outbox.SenderFunc(func(ctx context.Context, m *outbox.Message) outbox.Result {
		entered <- m.Key
		<-proceed
		if m.Key == "ack-then-fail" {
			return outbox.Result{Status: outbox.Pending, Err: errors.New("timeout reading the answer")}
		}
		return outbox.Result{Status: outbox.Sent}
	})
	r := relay(t, b.Outbox.Store, s, outbox.RelayConfig{Concurrency: 2})
	done := make(chan error, 1)
	go func() { _, err := r.RunOnce(ctx); done <- err }()
	<-entered
	<-entered
	for _, k := range []string{"ack-then-fail", "ack-then-sent"} {
		if err := b.Outbox.Ack(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ack-then-fail", "ack-then-sent"} {
		if row, err := b.Outbox.Get(ctx, k); err != nil || row.Status != outbox.Acked {
			t.Errorf("%s: the relay overwrote the ack: %+v, %v", k, row, err)
		}
	}
	// Nothing is due: an acked row is never sent again.
	if n, err := r.RunOnce(ctx); n != 0 || err != nil {
		t.Fatalf("after the ack the relay claimed %d rows, %v", n, err)
	}
}

// testSlowBatch: a batch whose sends take longer than the claim's lease (here
// 8 sends of 400 ms one at a time against a 2.4 s lease) must not let a second
// relay re-claim and re-send rows the first already sent or is about to.
func testSlowBatch[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	const n = 8
	for i := range n {
		if err := b.Outbox.Enqueue(ctx, msg(fmt.Sprint("slow", i))); err != nil {
			t.Fatal(err)
		}
	}
	s := newSink()
	// The relay keeps its claim by renewing it every Lease/4; a process
	// that cannot renew for a whole lease (stopped, or starved of CPU)
	// loses it, and a send it has under way then happens twice — what a
	// lease cannot prevent, and why receivers deduplicate by the key. So
	// the lease leaves a loaded machine room: CI runs under -race beside
	// other packages resent a row at a 600 ms lease, and once at 1.2 s.
	s.delay = 400 * time.Millisecond
	cfg := outbox.RelayConfig{Batch: n, Concurrency: 1, Lease: 2400 * time.Millisecond, SendTimeout: 800 * time.Millisecond}
	var wg sync.WaitGroup
	deadline := time.Now().Add(20 * time.Second)
	for range 2 {
		r := relay(t, b.Outbox.Store, s, cfg)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if _, err := r.RunOnce(ctx); err != nil {
					t.Error(err)
					return
				}
				st, err := b.Outbox.Stats(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if st.Pending == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	for i := range n {
		k := fmt.Sprint("slow", i)
		if c := s.count(k); c != 1 {
			t.Errorf("%s sent %d times by two relays", k, c)
		}
		if row, err := b.Outbox.Get(ctx, k); err != nil || row.Status != outbox.Sent {
			t.Errorf("%s: %+v, %v", k, row, err)
		}
	}
}

// testClaimOutlivesSend: a relay keeps its claim alive while a send is in
// flight, even one that runs far past SendTimeout and the lease: a second
// relay polling meanwhile never takes the row, and the row is sent once.
func testClaimOutlivesSend[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	if err := b.Outbox.Enqueue(ctx, msg("stuck")); err != nil {
		t.Fatal(err)
	}
	// The lease leaves a loaded machine time for a renewal (every Lease/4)
	// to land: at 400 ms, a run of four -race packages at once (NATS
	// clusters starting beside it) once had the second relay take the row.
	cfg := outbox.RelayConfig{Batch: 1, Concurrency: 1, Lease: 1200 * time.Millisecond, SendTimeout: 200 * time.Millisecond}
	// A sender that ignores its context (a client library that does not
	// honour deadlines): the send returns only when released.
	slow := newSink()
	slow.entered, slow.release = make(chan struct{}, 1), make(chan struct{})
	first := relay(t, b.Outbox.Store, slow, cfg)
	done := make(chan error, 1)
	go func() { _, err := first.RunOnce(ctx); done <- err }()
	<-slow.entered
	other := newSink()
	second := relay(t, b.Outbox.Store, other, cfg)
	// Poll for two leases: the row must stay the first relay's.
	for until := time.Now().Add(2 * cfg.Lease); time.Now().Before(until); {
		n, err := second.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("a second relay took the row while the first was still sending it")
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(slow.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if row, err := b.Outbox.Get(ctx, "stuck"); err != nil || row.Status != outbox.Sent || slow.count("stuck") != 1 || other.count("stuck") != 0 {
		t.Fatalf("row %+v, %v; sends %d by the first relay, %d by the second", row, err, slow.count("stuck"), other.count("stuck"))
	}
}

// testRenewalAfterLoss: a relay frozen mid-batch (its statements held) loses
// its claim to another relay; when it thaws, its renewal finds the rows
// taken and must not count as one: the rest of its batch is not sent by it
// (the other relay sends every row once).
func testRenewalAfterLoss[TTx any](t *testing.T, b Backend[TTx]) {
	ctx := context.Background()
	for _, k := range []string{"lost-1", "lost-2"} {
		if err := b.Outbox.Enqueue(ctx, msg(k)); err != nil {
			t.Fatal(err)
		}
	}
	frozen := &freezable[TTx]{Driver: b.Driver, thawed: make(chan struct{}), execs: make(chan struct{}, 1)}
	close(frozen.thawed)
	frozenOutbox, err := outbox.New[TTx](frozen, b.Config)
	if err != nil {
		t.Fatal(err)
	}
	slow := newSink()
	slow.entered, slow.release = make(chan struct{}, 1), make(chan struct{})
	cfg := outbox.RelayConfig{Batch: 2, Concurrency: 1, Lease: 800 * time.Millisecond, SendTimeout: 200 * time.Millisecond}
	first := relay(t, frozenOutbox.Store, slow, cfg)
	done := make(chan error, 1)
	go func() { _, err := first.RunOnce(ctx); done <- err }()
	select { // lost-1 is being sent; lost-2 waits for the slot
	case <-slow.entered:
	case err := <-done:
		t.Fatalf("the first relay's batch ended before it sent lost-1: %v", err)
	}
	frozen.freeze()
	select { // forget a renewal that ran before the freeze
	case <-frozen.execs:
	default:
	}
	other := newSink()
	second := relay(t, b.Outbox.Store, other, outbox.RelayConfig{Batch: 2})
	for deadline := time.Now().Add(5 * time.Second); other.count("lost-2") == 0; time.Sleep(20 * time.Millisecond) {
		if _, err := second.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the frozen relay's rows were never claimed again")
		}
	}
	frozen.thaw() // its held renewal runs now, and finds the rows taken
	<-frozen.execs
	close(slow.release)
	<-done
	if n := slow.count("lost-2"); n != 0 {
		t.Fatalf("the relay that lost its claim sent lost-2 %d times after thawing", n)
	}
	if other.count("lost-1") != 1 || other.count("lost-2") != 1 {
		t.Fatalf("the second relay sent lost-1 %d and lost-2 %d times, want once each", other.count("lost-1"), other.count("lost-2"))
	}
}
