package lambdaidem_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	_ "modernc.org/sqlite"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/lambdaidem"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

const queueARN = "arn:aws:sqs:eu-west-1:123456789012:payments"

func record(id, key, body string) events.SQSMessage {
	m := events.SQSMessage{MessageId: id, Body: body, EventSourceARN: queueARN, EventSource: "aws:sqs",
		MessageAttributes: map[string]events.SQSMessageAttribute{}}
	if key != "" {
		m.MessageAttributes[lambdaidem.KeyAttribute] = events.SQSMessageAttribute{DataType: "String", StringValue: &key}
	}
	return m
}

func failures(resp events.SQSEventResponse) []string {
	var ids []string
	for _, f := range resp.BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	slices.Sort(ids)
	return ids
}

// counter counts the work's runs per key.
type counter struct {
	mu   sync.Mutex
	runs map[string]int
}

func (c *counter) add(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string]int{}
	}
	c.runs[key]++
}

func (c *counter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[key]
}

func newGuard(t *testing.T, cfg idem.Config) (*idem.Guard, store.Store) {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	cfg.Store = s
	g, err := idem.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g, s
}

// TestBatchItemFailures: a batch with a duplicate of one record, a record
// without a key, a record whose key another invocation holds and one whose
// work fails. The response names exactly the records that must come back;
// the duplicate is settled without running again.
func TestBatchItemFailures(t *testing.T) {
	g, _ := newGuard(t, idem.Config{})
	var runs counter
	h, err := lambdaidem.GuardSQS(g, lambdaidem.Config{Scope: "payments"}, func(ctx context.Context, r *lambdaidem.Record, fence uint64) ([]byte, error) {
		key := r.Header(lambdaidem.KeyAttribute)
		runs.add(key)
		if key == "PAY-FAIL" {
			return nil, errors.New("ledger unavailable")
		}
		return []byte("booked"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Another invocation holds PAY-BUSY.
	held, release := make(chan struct{}), make(chan struct{})
	go g.Run(context.Background(), idem.Key{Scope: "payments", ID: "PAY-BUSY"}, &idem.RunOptions{Fingerprint: idem.Fingerprint([]byte("busy"))},
		func(context.Context, uint64) ([]byte, error) { close(held); <-release; return nil, nil })
	<-held
	defer close(release)

	resp, err := h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
		record("m1", "PAY-1", "credit 10"),
		record("m2", "PAY-1", "credit 10"), // a duplicate with another message id
		record("m3", "", "no key"),
		record("m4", "PAY-BUSY", "busy"),
		record("m5", "PAY-FAIL", "credit 30"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := failures(resp); !slices.Equal(got, []string{"m3", "m4", "m5"}) {
		t.Fatalf("batch item failures %v, want m3 (no key), m4 (in progress), m5 (failed)", got)
	}
	if runs.get("PAY-1") != 1 || runs.get("") != 0 || runs.get("PAY-BUSY") != 0 {
		t.Fatalf("runs %v", runs.runs)
	}
	// The redelivery of the whole batch: the completed record stays settled.
	resp, _ = h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{record("m6", "PAY-1", "credit 10")}})
	if len(resp.BatchItemFailures) != 0 || runs.get("PAY-1") != 1 {
		t.Fatalf("a redelivered completed record: failures %v, runs %d", failures(resp), runs.get("PAY-1"))
	}
}

// TestPoisonedRecordComesBackUnrun: a record whose work failed MaxAttempts
// times is poisoned: it comes back (for the queue's redrive policy to
// dead-letter) and its work does not run again.
func TestPoisonedRecordComesBackUnrun(t *testing.T) {
	g, _ := newGuard(t, idem.Config{MaxAttempts: 2})
	var runs counter
	var decisions []broker.Decision
	h, _ := lambdaidem.GuardSQS(g, lambdaidem.Config{Scope: "payments", OnDecision: func(_ *lambdaidem.Record, d broker.Decision) { decisions = append(decisions, d) }},
		func(ctx context.Context, r *lambdaidem.Record, fence uint64) ([]byte, error) {
			runs.add("PAY-4")
			return nil, errors.New("ledger unavailable")
		})
	for range 3 {
		resp, _ := h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{record("m1", "PAY-4", "credit 40")}})
		if got := failures(resp); !slices.Equal(got, []string{"m1"}) {
			t.Fatalf("failures %v", got)
		}
	}
	if runs.get("PAY-4") != 2 || decisions[2].Verdict != broker.DeadLetter {
		t.Fatalf("%d runs (want 2), last decision %+v (want dead-letter)", runs.get("PAY-4"), decisions[2])
	}
}

// TestDeadlineShorterThanTheLease: an invocation whose deadline comes
// long before the Guard's lease ends. The work's context ends before the
// deadline, the handler answers in time with the unfinished records, and
// the claims end at the deadline plus the margin — not a lease later — so
// the redelivery runs them.
func TestDeadlineShorterThanTheLease(t *testing.T) {
	g, s := newGuard(t, idem.Config{Lease: time.Minute})
	var runs counter
	h, _ := lambdaidem.GuardSQS(g, lambdaidem.Config{Scope: "payments", LeaseMargin: 100 * time.Millisecond, ReturnBefore: 200 * time.Millisecond},
		func(ctx context.Context, r *lambdaidem.Record, fence uint64) ([]byte, error) {
			runs.add(r.Header(lambdaidem.KeyAttribute))
			<-ctx.Done() // work that would take longer than the invocation has
			return nil, ctx.Err()
		})
	deadline := time.Now().Add(time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, _ := h(ctx, events.SQSEvent{Records: []events.SQSMessage{record("m1", "PAY-5", "credit 50"), record("m2", "PAY-6", "credit 60")}})
	if time.Now().After(deadline) {
		t.Fatal("the handler answered after the invocation's deadline")
	}
	if got := failures(resp); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("failures %v, want both", got)
	}
	rec, err := s.Get(context.Background(), g.StorageKey(idem.Key{Scope: "payments", ID: "PAY-5"}))
	if err != nil {
		t.Fatal(err)
	}
	if limit := deadline.Add(100*time.Millisecond + 10*time.Millisecond); rec.LeaseUntil.After(limit) {
		t.Fatalf("the claim lives until %v, %v past the deadline", rec.LeaseUntil, rec.LeaseUntil.Sub(deadline))
	}
	for time.Now().Before(rec.LeaseUntil.Add(10 * time.Millisecond)) {
		time.Sleep(10 * time.Millisecond) // the claim's end is a wall-clock time
	}
	h2, _ := lambdaidem.GuardSQS(g, lambdaidem.Config{Scope: "payments"}, func(ctx context.Context, r *lambdaidem.Record, fence uint64) ([]byte, error) {
		runs.add(r.Header(lambdaidem.KeyAttribute))
		return nil, nil
	})
	resp, _ = h2(context.Background(), events.SQSEvent{Records: []events.SQSMessage{record("m3", "PAY-5", "credit 50")}})
	if len(resp.BatchItemFailures) != 0 || runs.get("PAY-5") != 2 {
		t.Fatalf("the redelivery: failures %v, %d runs", failures(resp), runs.get("PAY-5"))
	}
}

// TestFIFOStopsAtTheFirstRecordThatComesBack: on a FIFO queue the records
// after one that must come back come back with it, unrun.
func TestFIFOStopsAtTheFirstRecordThatComesBack(t *testing.T) {
	g, _ := newGuard(t, idem.Config{})
	var order []string
	h, _ := lambdaidem.GuardSQS(g, lambdaidem.Config{Scope: "payments", Concurrency: 8}, func(ctx context.Context, r *lambdaidem.Record, fence uint64) ([]byte, error) {
		order = append(order, r.MessageId)
		if r.MessageId == "m2" {
			return nil, errors.New("ledger unavailable")
		}
		return nil, nil
	})
	var recs []events.SQSMessage
	for _, id := range []string{"m1", "m2", "m3", "m4"} {
		m := record(id, "K-"+id, "x")
		m.EventSourceARN = queueARN + ".fifo"
		recs = append(recs, m)
	}
	resp, _ := h(context.Background(), events.SQSEvent{Records: recs})
	if got := failures(resp); !slices.Equal(got, []string{"m2", "m3", "m4"}) || !slices.Equal(order, []string{"m1", "m2"}) {
		t.Fatalf("failures %v, ran %v", got, order)
	}
}

// TestInboxSQS: the inbox handler commits a record's key in the database's
// transaction; a duplicate in the same batch commits nothing; a base64
// body arrives decoded.
func TestInboxSQS(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "app.db")+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ib, _ := inbox.New(databasesql.New(db, sqldriver.SQLite), inbox.Config{})
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	var outs []string
	var payload []byte
	h, _ := lambdaidem.InboxSQS(lambdaidem.Config{Scope: "payments"}, func(ctx context.Context, r *lambdaidem.Record, id string) (inbox.Outcome, error) {
		out, err := ib.Process(ctx, inbox.Event{Consumer: "payments", CorrelationID: id}, func(ctx context.Context, tx *sql.Tx) error {
			payload = r.Data
			return nil
		})
		outs = append(outs, out.String())
		return out, err
	})
	enc := "base64"
	a, b := record("m1", "PAY-7", "AP8B"), record("m2", "PAY-7", "AP8B")
	for _, m := range []*events.SQSMessage{&a, &b} {
		m.MessageAttributes[lambdaidem.EncodingAttribute] = events.SQSMessageAttribute{DataType: "String", StringValue: &enc}
	}
	resp, _ := h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{a, b}})
	if len(resp.BatchItemFailures) != 0 || !slices.Equal(outs, []string{"processed", "duplicate"}) || string(payload) != "\x00\xff\x01" {
		t.Fatalf("failures %v, outcomes %v, payload %q", failures(resp), outs, payload)
	}
}
