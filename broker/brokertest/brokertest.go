// Package brokertest is the conformance suite of idem's broker adapters
// (natsidem, amqpidem, kafkaidem, sqsidem, watermillidem), on the model of Watermill's
// pubsub/tests: one suite, features each adapter declares, and a crash of a
// real consumer process. It runs against the real broker.
//
// What it checks, for a consumer running idem.Guard through the adapter:
//   - a duplicate (same producer key, new broker id) is acked without
//     running the work again;
//   - a duplicate that arrives while the first copy runs is retried later
//     (with the policy's in-progress delay where the broker can delay), and
//     acked once the first completes;
//   - a message without a key, or whose key was used with another payload,
//     is dead-lettered at once;
//   - a message whose work keeps failing is retried and then dead-lettered
//     as poisoned after MaxAttempts, the work having run exactly that often;
//   - a consumer process killed with SIGKILL mid-work: the message is
//     redelivered to another consumer, which takes the key over once the
//     lease ended and runs the work to completion.
package brokertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/sqlitestore"
)

// KeyHeader is the header that carries the producer's key in the suite's
// messages; adapters under test extract it with broker.HeaderKey(KeyHeader).
const KeyHeader = "correlation_id"

// Scope is the scope the adapters under test give their keys.
const Scope = "brokertest"

// Event is one decision an adapter applied to a delivery.
type Event struct {
	Key string // "" when the message had none
	broker.Decision
}

// Work is the business step; key is the message's producer key.
type Work func(ctx context.Context, key string, body []byte) error

// Features declares what an adapter's broker can do.
type Features struct {
	// RetryDelay: a retried message comes back after the decision's delay
	// (JetStream NakWithDelay, an unacked AMQP delivery requeued later),
	// not at once.
	RetryDelay bool
	// CrossProcess: consumers in several processes share the topic, so a
	// killed consumer's message is redelivered to another.
	CrossProcess bool
}

// Harness connects the suite to one adapter and its broker.
type Harness struct {
	Features Features
	// NewTopic creates a fresh topic (stream, queue) and returns its name;
	// it is removed when t ends.
	NewTopic func(t testing.TB) string
	// Consume consumes topic through the adapter over g, with policy,
	// running work for the messages whose key it owns, until stop or the
	// end of t; every applied decision is sent to events. A message that
	// redelivers must come back to some consumer of the topic.
	Consume func(t testing.TB, topic string, g *idem.Guard, policy broker.Policy, work Work, events chan<- Event) (stop func())
	// Publish publishes body on topic with key in KeyHeader ("" for none)
	// and a new broker message id.
	Publish func(t testing.TB, topic, key string, body []byte)
	// Diagnose, if set, tells where topic's messages are, as the broker
	// sees them (queue depths, unacknowledged deliveries and their
	// consumers; a group's members, assignments and committed offsets):
	// a campaign whose keys are not completed prints it.
	Diagnose func(t testing.TB, topic string) string
}

// Environment of a crash-test consumer process.
const (
	envChild = "IDEM_BROKERTEST_CHILD"
	envTopic = "IDEM_BROKERTEST_TOPIC"
	envStore = "IDEM_BROKERTEST_STORE"
	working  = "IDEM BROKERTEST WORKING"
)

// Run runs the suite. In a crash-test child process (started by the suite
// itself re-running the calling test) it consumes until it is killed.
func Run(t *testing.T, h Harness) {
	if os.Getenv(envChild) != "" {
		runChild(t, h)
		return
	}
	t.Run("DuplicateIsAcked", func(t *testing.T) { testDuplicate(t, h) })
	t.Run("InProgressIsRetriedLater", func(t *testing.T) { testInProgress(t, h) })
	t.Run("UnprocessableIsDeadLettered", func(t *testing.T) { testDeadLetter(t, h) })
	t.Run("PoisonedAfterMaxAttempts", func(t *testing.T) { testPoison(t, h) })
	if h.Features.CrossProcess {
		t.Run("RedeliveredAfterConsumerCrash", func(t *testing.T) { testCrash(t, h) })
	}
}

// recorder counts the work's runs per key.
type recorder struct {
	mu   sync.Mutex
	runs map[string]int
}

func (r *recorder) add(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runs == nil {
		r.runs = map[string]int{}
	}
	r.runs[key]++
	return r.runs[key]
}

func (r *recorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[key]
}

func newGuard(t testing.TB, cfg idem.Config) *idem.Guard {
	t.Helper()
	if cfg.Store == nil {
		s := memstore.New(memstore.Config{})
		t.Cleanup(func() { s.Close() })
		cfg.Store = s
	}
	g, err := idem.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

var fast = broker.Policy{InProgressDelay: 300 * time.Millisecond, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}

// await returns the next event satisfying ok, failing after 20s.
func await(t *testing.T, events <-chan Event, what string, ok func(Event) bool) Event {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case e := <-events:
			if ok(e) {
				return e
			}
		case <-deadline:
			t.Fatalf("no event: %s", what)
		}
	}
}

func is(key string, v broker.Verdict) func(Event) bool {
	return func(e Event) bool { return e.Key == key && e.Verdict == v }
}

// counting consumes a fresh topic through g with work that counts its
// runs per key and returns fail; it returns the topic, the counts and the
// decisions.
func counting(t *testing.T, h Harness, g *idem.Guard, fail error) (string, *recorder, chan Event) {
	topic := h.NewTopic(t)
	rec := &recorder{}
	events := make(chan Event, 1024)
	stop := h.Consume(t, topic, g, fast, func(ctx context.Context, key string, _ []byte) error {
		rec.add(key)
		return fail
	}, events)
	t.Cleanup(stop)
	return topic, rec, events
}

func testDuplicate(t *testing.T, h Harness) {
	topic, rec, events := counting(t, h, newGuard(t, idem.Config{}), nil)
	h.Publish(t, topic, "PAY-1", []byte("credit 10"))
	await(t, events, "the first copy acked", is("PAY-1", broker.Ack))
	h.Publish(t, topic, "PAY-1", []byte("credit 10")) // the producer's retry: a new broker id
	await(t, events, "the duplicate acked", is("PAY-1", broker.Ack))
	if n := rec.count("PAY-1"); n != 1 {
		t.Fatalf("the work ran %d times, want 1", n)
	}
}

// testInProgress: another consumer (here: the test, through the same
// Guard) holds the key while the message arrives.
func testInProgress(t *testing.T, h Harness) {
	g := newGuard(t, idem.Config{Lease: 10 * time.Second})
	topic, rec, events := counting(t, h, g, nil)
	release, started := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := g.Run(context.Background(), idem.Key{Scope: Scope, ID: "PAY-2"}, &idem.RunOptions{Fingerprint: idem.Fingerprint([]byte("credit 20"))},
			func(context.Context, uint64) ([]byte, error) {
				rec.add("PAY-2")
				close(started)
				<-release
				return nil, nil
			})
		done <- err
	}()
	<-started
	h.Publish(t, topic, "PAY-2", []byte("credit 20"))
	e := await(t, events, "the duplicate retried while the first copy runs", is("PAY-2", broker.Retry))
	if h.Features.RetryDelay && e.Delay < fast.InProgressDelay {
		t.Errorf("in-progress retry delay %v, want the policy's %v", e.Delay, fast.InProgressDelay)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	await(t, events, "the duplicate acked once the first completed", is("PAY-2", broker.Ack))
	if n := rec.count("PAY-2"); n != 1 {
		t.Fatalf("the work ran %d times, want 1", n)
	}
}

func testDeadLetter(t *testing.T, h Harness) {
	topic, rec, events := counting(t, h, newGuard(t, idem.Config{}), nil)
	h.Publish(t, topic, "", []byte("no key"))
	await(t, events, "the keyless message dead-lettered", is("", broker.DeadLetter))
	h.Publish(t, topic, "PAY-3", []byte("credit 30"))
	await(t, events, "the first use of the key acked", is("PAY-3", broker.Ack))
	h.Publish(t, topic, "PAY-3", []byte("credit 3000")) // the key reused with another payload
	e := await(t, events, "the reused key dead-lettered", is("PAY-3", broker.DeadLetter))
	if e.Reason == "" {
		t.Error("a dead letter without a reason")
	}
	if n := rec.count("PAY-3"); n != 1 || rec.count("") != 0 {
		t.Fatalf("the work ran %d times for PAY-3 (want 1) and %d for the keyless message (want 0)", n, rec.count(""))
	}
}

func testPoison(t *testing.T, h Harness) {
	const maxAttempts = 3
	topic, rec, events := counting(t, h, newGuard(t, idem.Config{MaxAttempts: maxAttempts}), errors.New("ledger unavailable")) // transient: released, retried
	h.Publish(t, topic, "PAY-4", []byte("credit 40"))
	e := await(t, events, "the failing message dead-lettered", is("PAY-4", broker.DeadLetter))
	if !strings.Contains(e.Reason, "poison") {
		t.Errorf("dead-lettered for %q, want poisoned", e.Reason)
	}
	if n := rec.count("PAY-4"); n != maxAttempts {
		t.Fatalf("the work ran %d times, want MaxAttempts = %d", n, maxAttempts)
	}
}

// crashLease is the lease in the crash test: the redelivered message is
// taken over once it ended.
const crashLease = time.Second

// crashGuard is the Guard of both processes of the crash test: a SQLite
// file they share.
func crashGuard(t testing.TB, path string) *idem.Guard {
	s, err := sqlitestore.Open(context.Background(), sqlitestore.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return newGuard(t, idem.Config{Store: s, Lease: crashLease})
}

func runChild(t *testing.T, h Harness) {
	g := crashGuard(t, os.Getenv(envStore))
	events := make(chan Event, 1024)
	h.Consume(t, os.Getenv(envTopic), g, fast, func(ctx context.Context, key string, _ []byte) error {
		fmt.Println(working, key)
		select {} // killed mid-work
	}, events)
	for range events {
	}
}

func testCrash(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	store := filepath.Join(t.TempDir(), "records.db")
	child := testenv.StartChild(t, strings.Split(t.Name(), "/")[0], envChild+"=1", envTopic+"="+topic, envStore+"="+store)
	h.Publish(t, topic, "PAY-5", []byte("credit 50"))
	child.WaitFor(t, working)
	child.Kill(t)
	killed := time.Now()

	// Another consumer gets the redelivery and takes the key over once the
	// dead consumer's lease ended.
	var rec recorder
	events := make(chan Event, 1024)
	stop := h.Consume(t, topic, crashGuard(t, store), fast, func(ctx context.Context, key string, _ []byte) error {
		rec.add(key)
		return nil
	}, events)
	defer stop()
	await(t, events, "the killed consumer's message completed by another", is("PAY-5", broker.Ack))
	if n := rec.count("PAY-5"); n != 1 {
		t.Fatalf("the work ran %d times after the crash, want 1", n)
	}
	if waited := time.Since(killed); waited < crashLease/2 {
		t.Errorf("completed %v after the kill: before the dead owner's lease could end", waited)
	}
	checkRecord(t, store)
}

// checkRecord: the shared store holds PAY-5 completed, taken over once.
func checkRecord(t *testing.T, path string) {
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var attempts int
	if err := db.QueryRow(`SELECT attempts FROM idem_records WHERE instr(k, CAST('PAY-5' AS BLOB)) > 0`).Scan(&attempts); err != nil || attempts != 2 {
		t.Fatalf("the record of PAY-5: %d attempts (%v), want 2 (the killed run and the takeover)", attempts, err)
	}
}
