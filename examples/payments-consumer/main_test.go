package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/internal/testenv"
)

// TestMain runs this test binary as payments-consumer when asked, so the
// tests start real consumer processes and kill them with SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv("PAYMENTS_CONSUMER_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// publisher sends instructions to one broker.
type publisher interface {
	publish(t *testing.T, brokerID string, body []byte)
}

type natsPub struct{ js jetstream.JetStream }

func (p natsPub) publish(t *testing.T, brokerID string, body []byte) {
	m := nats.NewMsg(subject)
	m.Data = body
	m.Header.Set(nats.MsgIdHdr, brokerID)
	if _, err := p.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

type amqpPub struct{ ch *amqp.Channel }

func (p amqpPub) publish(t *testing.T, brokerID string, body []byte) {
	if err := p.ch.PublishWithContext(context.Background(), "", queueName, false, false,
		amqp.Publishing{MessageId: brokerID, DeliveryMode: amqp.Persistent, Body: body}); err != nil {
		t.Fatal(err)
	}
}

// kafkaPub writes an instruction as a record of the topic: every other one
// with an Idempotency-Key header of its own, as idem's outbox sends each
// row under the row's key — two rows of one instruction carry two keys —
// the others without.
type kafkaPub struct {
	cl    *kgo.Client
	topic string
	n     *int
}

func (p kafkaPub) publish(t *testing.T, brokerID string, body []byte) {
	rec := &kgo.Record{Topic: p.topic, Value: body}
	if *p.n++; *p.n%2 == 0 {
		rec.Headers = []kgo.RecordHeader{{Key: "Idempotency-Key", Value: []byte("row-" + brokerID)}}
	}
	if err := p.cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func setupKafka(t *testing.T) (string, publisher) {
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "payments-", 4)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return "kafka://" + strings.Join(brokers, ",") + "/" + topic, kafkaPub{cl, topic, new(int)}
}

// sqsPub sends an instruction to the queue, every other one with an
// Idempotency-Key attribute of its own, as idem's outbox does.
type sqsPub struct {
	c   *sqs.Client
	url string
	n   *int
}

func (p sqsPub) publish(t *testing.T, brokerID string, body []byte) {
	in := &sqs.SendMessageInput{QueueUrl: aws.String(p.url), MessageBody: aws.String(string(body))}
	if *p.n++; *p.n%2 == 0 {
		in.MessageAttributes = map[string]sqstypes.MessageAttributeValue{"Idempotency-Key": {DataType: aws.String("String"), StringValue: aws.String("row-" + brokerID)}}
	}
	if _, err := p.c.SendMessage(context.Background(), in); err != nil {
		t.Fatal(err)
	}
}

func setupSQS(t *testing.T) (string, publisher) {
	c := testenv.SQSClient(t)
	name := testenv.RandomName("payments-")
	out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
		if dlq, err := c.GetQueueUrl(context.Background(), &sqs.GetQueueUrlInput{QueueName: aws.String(name + "-dlq")}); err == nil {
			_, _ = c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: dlq.QueueUrl})
		}
	})
	return "sqs://" + name, sqsPub{c, *out.QueueUrl, new(int)}
}

func setupNATS(t *testing.T) (string, publisher) {
	nc, err := nats.Connect(testenv.NATSURL, nats.Timeout(3*time.Second))
	testenv.Need(t, "NATS", testenv.NATSURL, err)
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	_ = js.DeleteStream(context.Background(), streamName) // a clean stream for this run
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: streamName, Subjects: []string{subject}}); err != nil {
		t.Fatal(err)
	}
	// The stream is the example's own name: leave nothing in it for a
	// reader trying the example on the same server.
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), streamName) })
	return testenv.NATSURL, natsPub{js}
}

func setupAMQP(t *testing.T) (string, publisher) {
	conn, err := amqp.DialConfig(testenv.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	testenv.Need(t, "RabbitMQ", testenv.AMQPURL, err)
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queueName, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueuePurge(queueName, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(queueName, false, false, false) })
	return testenv.AMQPURL, amqpPub{ch}
}

func startConsumer(t *testing.T, brokerURL, dbURL, name string) *exec.Cmd {
	session := "1s" // on the tests' kfake cluster; a real one allows six at least
	if testenv.KafkaBrokers() != nil {
		session = "6s"
	}
	cmd := exec.Command(os.Args[0], "--broker", brokerURL, "--db", dbURL, "--ack-wait", "2s", "--consumer", name, "--session-timeout", session)
	cmd.Env = append(os.Environ(), "PAYMENTS_CONSUMER_MAIN=1")
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// TestExactlyOnceWithCrash sends 1,000 deliveries (800 instructions, 200
// duplicates with new broker ids) to two competing consumers, kills one
// with SIGKILL mid-stream, and checks every instruction is booked exactly
// once and every balance is exact.
func TestExactlyOnceWithCrash(t *testing.T) {
	for name, setup := range map[string]func(*testing.T) (string, publisher){"nats": setupNATS, "amqp": setupAMQP, "kafka": setupKafka, "sqs": setupSQS} {
		t.Run(name, func(t *testing.T) {
			brokerURL, pub := setup(t)
			ctx := context.Background()
			pool, schema, dbURL := paymentsDB(t)

			consumer := testenv.RandomName("credit-transfers-")
			a := startConsumer(t, brokerURL, dbURL, consumer)
			startConsumer(t, brokerURL, dbURL, consumer)

			const instructions, duplicates = 800, 200
			want := map[string]int64{}
			var sent []Instruction
			for i := range instructions {
				in := Instruction{CorrelationID: fmt.Sprintf("PAY-%04d", i), Account: fmt.Sprintf("ACC-%d", i%10), AmountCents: int64(100 + rand.IntN(10000))}
				sent = append(sent, in)
				want[in.Account] += in.AmountCents
			}
			deliveries := append([]Instruction{}, sent...)
			for range duplicates {
				deliveries = append(deliveries, sent[rand.IntN(len(sent))])
			}
			rand.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
			for i, in := range deliveries {
				body, _ := json.Marshal(in)
				pub.publish(t, fmt.Sprintf("broker-msg-%d", i), body)
				if i == len(deliveries)/3 {
					time.Sleep(200 * time.Millisecond) // let both work
					if err := a.Process.Signal(syscall.SIGKILL); err != nil {
						t.Fatal(err)
					}
					t.Logf("killed consumer A with SIGKILL after %d deliveries", i+1)
				}
			}
			booked := checkBooked(t, pool, schema, instructions, want)
			var inboxRows int
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.processed_events`).Scan(&inboxRows)
			t.Logf("%d deliveries (%d duplicates), one consumer killed: %d instructions booked once each, %d inbox rows, balances exact",
				len(deliveries), duplicates, booked, inboxRows)
		})
	}
}

// paymentsDB makes a schema of the test's own on PostgreSQL and returns a
// pool, the schema and the URL the consumers are given.
func paymentsDB(t *testing.T) (*pgxpool.Pool, string, string) {
	t.Helper()
	testenv.ProbePostgres(t)
	ctx := context.Background()
	schema := testenv.RandomName("idemtest_")
	pool, err := pgxpool.New(ctx, testenv.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })
	u, _ := url.Parse(testenv.PostgresURL)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return pool, schema, u.String()
}

// booked is how many distinct instructions are booked.
func booked(pool *pgxpool.Pool, schema string) int {
	var n int
	_ = pool.QueryRow(context.Background(), `SELECT count(DISTINCT correlation_id) FROM `+schema+`.credit_transfers`).Scan(&n)
	return n
}

// checkBooked waits until instructions are booked (90 s at most) and for
// late redeliveries, then checks each was booked once and the balances are
// want; it returns how many were booked.
func checkBooked(t *testing.T, pool *pgxpool.Pool, schema string, instructions int, want map[string]int64) int {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(90 * time.Second)
	for booked(pool, schema) < instructions && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // redeliveries of a killed consumer's messages land
	n := booked(pool, schema)
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.credit_transfers`).Scan(&rows)
	if n != instructions || rows != instructions {
		t.Fatalf("%d instructions booked in %d rows; want %d in %d", n, rows, instructions, instructions)
	}
	got := map[string]int64{}
	r, err := pool.Query(ctx, `SELECT account, balance_cents FROM `+schema+`.accounts`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var acc string
		var bal int64
		_ = r.Scan(&acc, &bal)
		got[acc] = bal
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("balances %v, want %v", got, want)
	}
	return n
}

// TestBrokerRestart: RabbitMQ (a node of the test's own) is killed with
// SIGKILL and started again between two halves of the instructions; both
// consumers ride it out — they connect again and declare their queue — and
// every instruction, before the crash and after, is booked once.
func TestBrokerRestart(t *testing.T) {
	node := testenv.StartRabbitMQ(t)
	pool, schema, dbURL := paymentsDB(t)
	consumer := testenv.RandomName("credit-transfers-")
	startConsumer(t, node.URL, dbURL, consumer)
	startConsumer(t, node.URL, dbURL, consumer)
	const instructions = 400
	want := map[string]int64{}
	send := func(from, to int) {
		t.Helper()
		ch := node.DurableQueue(t, queueName) // a new connection: the node may have crashed since
		for i := from; i < to; i++ {
			in := Instruction{CorrelationID: fmt.Sprintf("PAY-%04d", i), Account: fmt.Sprintf("ACC-%d", i%10), AmountCents: int64(100 + i)}
			want[in.Account] += in.AmountCents
			body, _ := json.Marshal(in)
			amqpPub{ch}.publish(t, fmt.Sprintf("broker-msg-%d", i), body)
		}
	}
	send(0, instructions/2)
	testenv.Eventually(t, 60*time.Second, "the first half booked", func() error {
		if n := booked(pool, schema); n < instructions/2 {
			return fmt.Errorf("%d booked", n)
		}
		return nil
	})
	node.Crash(t)
	send(instructions/2, instructions)
	n := checkBooked(t, pool, schema, instructions, want)
	t.Logf("the broker crashed between two halves: %d instructions booked once each, balances exact", n)
}
