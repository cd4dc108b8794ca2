package kafkaidem_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	_ "modernc.org/sqlite"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/kafkaidem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

var fast = broker.Policy{InProgressDelay: 100 * time.Millisecond, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}

type decision struct {
	key       string
	partition int32
	broker.Decision
}

// consumer is one member of a topic's group under test.
type consumer struct {
	events chan decision
	stop   func() // cancels Run and waits for it to return
}

func newGuard(t testing.TB, s store.Store) *idem.Guard {
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func newStore(t testing.TB) store.Store {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	return s
}

// clientOptions are a group member's options on topic.
func clientOptions(brokers []string, topic string) []kgo.Opt {
	return append(testenv.KafkaGroupOptions(), kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("group-"+topic),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
}

// run starts a Consumer made by mk with cfg completed for topic.
func run(t *testing.T, brokers []string, topic string, cfg kafkaidem.Config, mk func(kafkaidem.Config) (*kafkaidem.Consumer, error)) *consumer {
	t.Helper()
	events := make(chan decision, 4096)
	if cfg.Scope == "" {
		cfg.Scope = "kafkaidem-test"
	}
	cfg.Policy = fast
	cfg.ClientOptions = append(clientOptions(brokers, topic), cfg.ClientOptions...)
	cfg.OnDecision = func(rec *kgo.Record, d broker.Decision) {
		events <- decision{key: header(rec, kafkaidem.KeyHeader), partition: rec.Partition, Decision: d}
	}
	c, err := mk(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &consumer{events: events, stop: start(t, c)}
}

// start runs c until the returned stop, or the end of t.
func start(t testing.TB, c *kafkaidem.Consumer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func guardConsumer(t *testing.T, brokers []string, topic string, g *idem.Guard, cfg kafkaidem.Config, work func(key string) error) *consumer {
	return run(t, brokers, topic, cfg, func(cfg kafkaidem.Config) (*kafkaidem.Consumer, error) {
		return kafkaidem.GuardConsumer(g, cfg, func(ctx context.Context, rec *kgo.Record, fence uint64) ([]byte, error) {
			return nil, work(header(rec, kafkaidem.KeyHeader))
		})
	})
}

// produce writes a record with key in the Idempotency-Key header to
// partition (-1: the default partitioner's choice).
func produce(t testing.TB, cl *kgo.Client, topic string, partition int32, key, body string) {
	t.Helper()
	rec := &kgo.Record{Topic: topic, Partition: partition, Value: []byte(body),
		Headers: []kgo.RecordHeader{{Key: kafkaidem.KeyHeader, Value: []byte(key)}}}
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func producer(t testing.TB, brokers []string) *kgo.Client {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func await(t *testing.T, events <-chan decision, what string, ok func(decision) bool) decision {
	t.Helper()
	deadline := time.After(time.Minute) // a loaded CI machine may cost a rebalance or two
	for {
		select {
		case e := <-events:
			if ok(e) {
				return e
			}
		case <-deadline:
			t.Fatalf("no decision: %s", what)
		}
	}
}

func is(key string, v broker.Verdict) func(decision) bool {
	return func(e decision) bool { return e.key == key && e.Verdict == v }
}

// committed returns the group's committed offset of topic's partition (-1
// for none).
func committed(t *testing.T, brokers []string, topic string, partition int32) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	offs, err := testenv.KafkaAdmin(t, brokers).FetchOffsets(ctx, "group-"+topic)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs.Lookup(topic, partition); ok && o.Err == nil {
		return o.At
	}
	return -1
}

func awaitCommitted(t *testing.T, brokers []string, topic string, partition int32, want int64) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, fmt.Sprintf("partition %d committed at %d", partition, want), func() error {
		if got := committed(t, brokers, topic, partition); got != want {
			return fmt.Errorf("committed at %d", got)
		}
		return nil
	})
}

// TestAKeyInProgressHoldsOnlyItsPartition: a record whose key another
// consumer holds is retried in place; the records after it on its partition
// wait, and its offset is not committed, while another partition's records
// complete and are committed; once the holder settles, the record replays.
func TestAKeyInProgressHoldsOnlyItsPartition(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemkafka-", 2)
	st := newStore(t)
	holder := newGuard(t, st)
	release, started, held := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := holder.Run(context.Background(), idem.Key{Scope: "kafkaidem-test", ID: "HELD"}, &idem.RunOptions{Fingerprint: idem.Fingerprint([]byte("held"))},
			func(context.Context, uint64) ([]byte, error) { close(started); <-release; return nil, nil })
		held <- err
	}()
	<-started
	var mu sync.Mutex
	ran := map[string]int{}
	c := guardConsumer(t, brokers, topic, newGuard(t, st), kafkaidem.Config{}, func(key string) error {
		mu.Lock()
		ran[key]++
		mu.Unlock()
		return nil
	})
	p := producer(t, brokers)
	produce(t, p, topic, 0, "HELD", "held")
	produce(t, p, topic, 0, "AFTER", "after")
	produce(t, p, topic, 1, "OTHER", "other")
	await(t, c.events, "the held key retried in place", is("HELD", broker.Retry))
	await(t, c.events, "the other partition's record acked meanwhile", is("OTHER", broker.Ack))
	await(t, c.events, "the held key retried again", is("HELD", broker.Retry))
	awaitCommitted(t, brokers, topic, 1, 1)
	if got := committed(t, brokers, topic, 0); got > 0 {
		t.Fatalf("partition 0 committed at %d while its first record is unsettled", got)
	}
	mu.Lock()
	if ran["AFTER"] != 0 {
		t.Fatal("the record after the held one ran before the held one settled")
	}
	mu.Unlock()
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	await(t, c.events, "the held key replayed once its holder settled", is("HELD", broker.Ack))
	await(t, c.events, "the record after it acked", is("AFTER", broker.Ack))
	awaitCommitted(t, brokers, topic, 0, 2)
	mu.Lock()
	defer mu.Unlock()
	if ran["HELD"] != 0 || ran["AFTER"] != 1 || ran["OTHER"] != 1 {
		t.Fatalf("runs: %v; want the held key's work run by its holder only", ran)
	}
}

// TestARecordFinishedAfterRevocationReplays: a consumer loses its partition
// while a record runs, past its RevokeTimeout; the new owner gets the
// record again (its offset was not committed), meets the key in progress,
// and replays it once the old owner — no longer owning the partition —
// completes it: the work runs once.
func TestARecordFinishedAfterRevocationReplays(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemkafka-", 1)
	st := newStore(t)
	var mu sync.Mutex
	runs := 0
	release, started := make(chan struct{}), make(chan struct{})
	old := guardConsumer(t, brokers, topic, newGuard(t, st), kafkaidem.Config{RevokeTimeout: 200 * time.Millisecond}, func(key string) error {
		mu.Lock()
		runs++
		mu.Unlock()
		close(started)
		<-release
		return nil
	})
	produce(t, producer(t, brokers), topic, 0, "SLOW", "slow")
	<-started
	successor := guardConsumer(t, brokers, topic, newGuard(t, st), kafkaidem.Config{}, func(key string) error {
		mu.Lock()
		runs++
		mu.Unlock()
		return nil
	})
	stopped := time.Now()
	old.stop() // leaves the group: the partition goes to the successor
	if d := time.Since(stopped); d > 5*time.Second {
		t.Fatalf("the old owner took %v to let its partition go, with a RevokeTimeout of 200ms", d)
	}
	if got := committed(t, brokers, topic, 0); got > 0 {
		t.Fatalf("committed at %d with the record unsettled", got)
	}
	await(t, successor.events, "the new owner retries the key in progress", is("SLOW", broker.Retry))
	close(release) // the old owner completes the record after losing the partition
	await(t, successor.events, "the new owner replays it", is("SLOW", broker.Ack))
	awaitCommitted(t, brokers, topic, 0, 1)
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Fatalf("the work ran %d times, want 1", runs)
	}
}

// TestRebalanceWhileConsuming: a second consumer joins and a third leaves
// while records flow through eight partitions: every key's work runs
// exactly once, and the group commits every record.
func TestRebalanceWhileConsuming(t *testing.T) {
	const partitions, records = 8, 400
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemkafka-", partitions)
	st := newStore(t)
	var mu sync.Mutex
	runs := map[string]int{}
	acked := map[string]bool{}
	allAcked := make(chan struct{})
	work := func(key string) error {
		mu.Lock()
		runs[key]++
		mu.Unlock()
		time.Sleep(time.Millisecond)
		return nil
	}
	var members []*consumer
	collect := func(c *consumer) {
		go func() {
			for e := range c.events {
				if e.Verdict != broker.Ack {
					continue
				}
				mu.Lock()
				acked[e.key] = true
				if len(acked) == records {
					close(allAcked)
				}
				mu.Unlock()
			}
		}()
	}
	join := func() *consumer {
		c := guardConsumer(t, brokers, topic, newGuard(t, st), kafkaidem.Config{Concurrency: 2, RevokeTimeout: time.Second}, work)
		members = append(members, c)
		collect(c)
		return c
	}
	join()
	leaving := join()
	p := producer(t, brokers)
	for i := range records {
		produce(t, p, topic, int32(i%partitions), fmt.Sprintf("K-%03d", i), "body")
		time.Sleep(2 * time.Millisecond) // the group changes while records flow
		switch i {
		case records / 4:
			join()
		case records / 2:
			leaving.stop()
		}
	}
	select {
	case <-allAcked:
	case <-time.After(60 * time.Second):
		mu.Lock()
		t.Fatalf("%d of %d keys acked", len(acked), records)
	}
	for n := range int32(partitions) {
		awaitCommitted(t, brokers, topic, n, records/partitions)
	}
	mu.Lock()
	defer mu.Unlock()
	for key, n := range runs {
		if n != 1 {
			t.Errorf("the work of %s ran %d times", key, n)
		}
	}
	if len(runs) != records {
		t.Errorf("%d keys ran, want %d", len(runs), records)
	}
}

// TestDeadLetterCopy: a record without a key is produced to the
// dead-letter topic with the reason and its origin, and committed.
func TestDeadLetterCopy(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemkafka-", 1)
	c := guardConsumer(t, brokers, topic, newGuard(t, newStore(t)), kafkaidem.Config{}, func(string) error { return nil })
	p := producer(t, brokers)
	if err := p.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("keyless")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	await(t, c.events, "the keyless record dead-lettered", is("", broker.DeadLetter))
	awaitCommitted(t, brokers, topic, 0, 1)

	recs := deadLetters(t, brokers, topic)
	if len(recs) != 1 {
		t.Fatalf("%d dead letters", len(recs))
	}
	r := recs[0]
	if string(r.Value) != "keyless" || string(r.Key) != "k" || header(r, kafkaidem.OriginalTopicHeader) != topic ||
		header(r, kafkaidem.OriginalOffsetHeader) != "0" || header(r, kafkaidem.OriginalPartitionHeader) != "0" ||
		!strings.Contains(header(r, kafkaidem.ReasonHeader), "no key") {
		t.Fatalf("the dead letter: key %q value %q headers %v", r.Key, r.Value, r.Headers)
	}
}

// TestDeadLetterTooLargeMovesOn: a record whose copy the dead-letter topic
// can never take (here the consumer's own producer refuses its size, as a
// broker refuses a record at its limit once idem's headers are added) is
// dead-lettered without its value, the reason saying so, and the partition
// goes on with the records after it. The producer's own Idem-* headers are
// not copied: a reader of the dead letter finds idem's reason and origin
// only.
func TestDeadLetterTooLargeMovesOn(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemkafka-", 1)
	c := guardConsumer(t, brokers, topic, newGuard(t, newStore(t)),
		kafkaidem.Config{ClientOptions: []kgo.Opt{kgo.ProducerBatchMaxBytes(64 << 10)}}, func(string) error { return nil })
	p := producer(t, brokers)
	big := &kgo.Record{Topic: topic, Key: []byte("k"), Value: bytes.Repeat([]byte("x"), 200<<10), Headers: []kgo.RecordHeader{
		{Key: kafkaidem.ReasonHeader, Value: []byte("forged")}, {Key: "idem-original-topic", Value: []byte("elsewhere")}, {Key: "X-Trace", Value: []byte("t1")}}}
	if err := p.ProduceSync(context.Background(), big).FirstErr(); err != nil {
		t.Fatal(err)
	}
	produce(t, p, topic, 0, "AFTER", "after the big one")
	d := await(t, c.events, "the big keyless record dead-lettered", is("", broker.DeadLetter))
	if !strings.Contains(d.Reason, "value") {
		t.Errorf("the decision's reason %q does not say the value was dropped", d.Reason)
	}
	await(t, c.events, "the record after it", is("AFTER", broker.Ack))
	awaitCommitted(t, brokers, topic, 0, 2)

	recs := deadLetters(t, brokers, topic)
	if len(recs) != 1 {
		t.Fatalf("%d dead letters", len(recs))
	}
	r := recs[0]
	if len(r.Value) != 0 || string(r.Key) != "k" || header(r, "X-Trace") != "t1" || header(r, kafkaidem.OriginalTopicHeader) != topic ||
		!strings.Contains(header(r, kafkaidem.ReasonHeader), "dropped") {
		t.Fatalf("the dead letter: key %q, %d bytes of value, headers %v", r.Key, len(r.Value), r.Headers)
	}
	for _, h := range r.Headers {
		if string(h.Value) == "forged" || string(h.Value) == "elsewhere" {
			t.Errorf("the producer's own %s: %q was copied", h.Key, h.Value)
		}
	}
}

// TestInboxConsumer: the transactional inbox books each key once, on one
// partition and on eight; a duplicate (a producer's retry: a new record at
// a new offset) is acked as a duplicate, and every record is committed.
func TestInboxConsumer(t *testing.T) {
	for _, partitions := range []int32{1, 8} {
		t.Run(fmt.Sprintf("Partitions%d", partitions), func(t *testing.T) { testInboxConsumer(t, partitions) })
	}
}

func testInboxConsumer(t *testing.T, partitions int32) {
	const keys = 40
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemkafka-", partitions)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "inbox.db")+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ib, err := inbox.New(databasesql.New(db, sqldriver.SQLite), inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE credits (key TEXT NOT NULL, body TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c := run(t, brokers, topic, kafkaidem.Config{Scope: "credits", Concurrency: 4}, func(cfg kafkaidem.Config) (*kafkaidem.Consumer, error) {
		return kafkaidem.InboxConsumer(cfg, func(ctx context.Context, rec *kgo.Record, id string) (inbox.Outcome, error) {
			return ib.Process(ctx, inbox.Event{Consumer: "credits", CorrelationID: id}, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO credits (key, body) VALUES (?, ?)`, id, string(rec.Value))
				return err
			})
		})
	})
	p := producer(t, brokers)
	for copy := range 2 {
		for i := range keys {
			// The copy lands on another partition where there are several:
			// keys, not partitions, keep duplicates apart.
			produce(t, p, topic, int32(i+copy)%partitions, fmt.Sprintf("PAY-%02d", i), "credit")
		}
	}
	outcomes := map[string]int{}
	for range 2 * keys {
		e := await(t, c.events, "a decision", func(e decision) bool { return true })
		if e.Verdict != broker.Ack {
			t.Fatalf("%s: %s (%s)", e.key, e.Verdict, e.Reason)
		}
		outcomes[e.Reason]++
	}
	if outcomes[inbox.Processed.String()] != keys || outcomes[inbox.Duplicate.String()] != keys {
		t.Fatalf("outcomes %v, want %d processed and %d duplicates", outcomes, keys, keys)
	}
	var n, distinct int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT key) FROM credits`).Scan(&n, &distinct); err != nil || n != keys || distinct != keys {
		t.Fatalf("%d credits of %d keys (%v), want %d of %d", n, distinct, err, keys, keys)
	}
	for part := range partitions {
		awaitCommitted(t, brokers, topic, part, 2*keys/int64(partitions))
	}
}

func TestConfig(t *testing.T) {
	g := newGuard(t, newStore(t))
	work := func(context.Context, *kgo.Record, uint64) ([]byte, error) { return nil, nil }
	if _, err := kafkaidem.GuardConsumer(g, kafkaidem.Config{ClientOptions: []kgo.Opt{kgo.ConsumerGroup("g")}}, work); err == nil {
		t.Error("a consumer without a scope was made")
	}
	if _, err := kafkaidem.GuardConsumer(g, kafkaidem.Config{Scope: "s", ClientOptions: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}}, work); err == nil ||
		!strings.Contains(err.Error(), "consumer group") {
		t.Errorf("a consumer without a group: %v", err)
	}
}

func TestOffsetKey(t *testing.T) {
	if _, err := kafkaidem.OffsetKey(fakeMessage{}); err == nil {
		t.Error("OffsetKey of a message that is no Kafka record")
	}
}

type fakeMessage struct{}

func (fakeMessage) Header(string) string { return "" }
func (fakeMessage) Body() []byte         { return nil }

// TestTracing: with Config.TracerProvider, a record is processed in a
// consumer span whose parent is the producer's span from the traceparent
// header, and the Guard's work runs in it.
func TestTracing(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemkafka-", 1)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	worked := make(chan trace.SpanContext, 1)
	c := run(t, brokers, topic, kafkaidem.Config{TracerProvider: tp}, func(cfg kafkaidem.Config) (*kafkaidem.Consumer, error) {
		return kafkaidem.GuardConsumer(newGuard(t, newStore(t)), cfg, func(ctx context.Context, rec *kgo.Record, fence uint64) ([]byte, error) {
			worked <- trace.SpanContextFromContext(ctx)
			return nil, nil
		})
	})
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	rec := &kgo.Record{Topic: topic, Value: []byte("credit"), Headers: []kgo.RecordHeader{
		{Key: kafkaidem.KeyHeader, Value: []byte("PAY-1")}, {Key: "traceparent", Value: []byte(parent)}}}
	if err := producer(t, brokers).ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	await(t, c.events, "the record acked", is("PAY-1", broker.Ack))
	in := <-worked
	testenv.Eventually(t, 5*time.Second, "the consumer span ended", func() error {
		if len(exp.GetSpans()) == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	span := exp.GetSpans()[0]
	if span.Name != "process "+topic || span.SpanKind != trace.SpanKindConsumer || span.Parent.SpanID().String() != "00f067aa0ba902b7" ||
		span.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || in.SpanID() != span.SpanContext.SpanID() {
		t.Fatalf("span %s (%v), parent %s, trace %s; the work ran in %s", span.Name, span.SpanKind, span.Parent.SpanID(), span.SpanContext.TraceID(), in.SpanID())
	}
}

// deadLetters reads the first records of topic's dead-letter topic.
func deadLetters(t *testing.T, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	dl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic+".DLT"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fs := dl.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil {
		t.Fatal(err)
	}
	return fs.Records()
}
