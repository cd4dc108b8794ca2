package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/broker/kafkaidem"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/broker/sqsidem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/outbox/kafkasender"
	"github.com/idemgo/idem/outbox/sqssender"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// Names fixed by the contract.
const (
	streamName = "PAYMENTS"
	subject    = "payments.instructions"
	queueName  = "payments.instructions"
)

// Instruction is one payment instruction.
type Instruction struct {
	CorrelationID string `json:"correlation_id"`
	Account       string `json:"account"`
	AmountCents   int64  `json:"amount_cents"`
}

const schema = `
CREATE TABLE IF NOT EXISTS credit_transfers (
	id             bigserial PRIMARY KEY,
	correlation_id text   NOT NULL, -- deliberately not unique: the inbox is what stops a double booking
	account        text   NOT NULL,
	amount_cents   bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS accounts (
	account       text   PRIMARY KEY,
	balance_cents bigint NOT NULL
);`

func main() {
	brokerURL := flag.String("broker", "", "nats://…, amqp://…, kafka://HOST[,HOST…]/TOPIC or sqs://QUEUE-NAME (required)")
	dbURL := flag.String("db", "", "postgres://… (required)")
	ackWait := flag.Duration("ack-wait", 30*time.Second, "JetStream AckWait: a message unacked this long is redelivered")
	consumer := flag.String("consumer", "credit-transfers", "durable consumer name, Kafka consumer group (and the inbox's consumer)")
	session := flag.Duration("session-timeout", 45*time.Second, "Kafka: how long the group waits for a silent member before its partitions move to the others")
	concurrency := flag.Int("concurrency", 8, "messages processed at once (each in its own transaction)")
	flag.Parse()
	if *brokerURL == "" || *dbURL == "" {
		fmt.Fprintln(os.Stderr, "usage: payments-consumer --broker URL --db URL [--ack-wait D] [--consumer NAME] [--concurrency N]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := log.New(os.Stderr, "payments-consumer: ", log.LstdFlags|log.Lmicroseconds)
	if err := run(ctx, logger, *brokerURL, *dbURL, *ackWait, *session, *consumer, *concurrency); err != nil {
		logger.Fatal(err)
	}
}

func run(ctx context.Context, logger *log.Logger, brokerURL, dbURL string, ackWait, session time.Duration, consumer string, concurrency int) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("--db: %w", err)
	}
	defer pool.Close()
	ib, err := inbox.New(pgxv5.New(pool), inbox.Config{ConsumerVersion: "payments-consumer/1"})
	if err != nil {
		return err
	}
	if err := migrate(ctx, pool, ib); err != nil {
		return err
	}
	book := func(ctx context.Context, id string, body []byte) (inbox.Outcome, error) {
		var in Instruction
		if err := json.Unmarshal(body, &in); err != nil {
			return 0, fmt.Errorf("instruction %s: %w", id, err)
		}
		out, err := ib.Process(ctx, inbox.Event{Consumer: consumer, CorrelationID: id, Type: "credit-transfer"},
			func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO credit_transfers (correlation_id, account, amount_cents) VALUES ($1, $2, $3)`,
					in.CorrelationID, in.Account, in.AmountCents); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO accounts (account, balance_cents) VALUES ($1, $2)
					ON CONFLICT (account) DO UPDATE SET balance_cents = accounts.balance_cents + EXCLUDED.balance_cents`,
					in.Account, in.AmountCents)
				return err
			})
		if err == nil {
			logger.Printf("%s %s: %d cents to %s", out, id, in.AmountCents, in.Account)
		}
		return out, err
	}
	cfg := broker.Policy{InProgressDelay: time.Second, BackoffMin: 100 * time.Millisecond, BackoffMax: 10 * time.Second}
	switch {
	case strings.HasPrefix(brokerURL, "nats://"), strings.HasPrefix(brokerURL, "tls://"):
		return runNATS(ctx, logger, brokerURL, ackWait, consumer, concurrency, cfg, book)
	case strings.HasPrefix(brokerURL, "amqp://"), strings.HasPrefix(brokerURL, "amqps://"):
		return runAMQP(ctx, logger, brokerURL, consumer, concurrency, cfg, book)
	case strings.HasPrefix(brokerURL, "kafka://"):
		return runKafka(ctx, logger, brokerURL, session, consumer, concurrency, cfg, book)
	case strings.HasPrefix(brokerURL, "sqs://"):
		return runSQS(ctx, logger, brokerURL, ackWait, consumer, concurrency, cfg, book)
	}
	return fmt.Errorf("--broker %q: want nats://…, amqp://…, kafka://… or sqs://…", brokerURL)
}

// migrate creates the tables once, even with several instances starting.
func migrate(ctx context.Context, pool *pgxpool.Pool, ib *inbox.Inbox[pgx.Tx]) error {
	if err := ib.Migrate(ctx); err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('payments-consumer'))`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, schema); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

type bookFunc func(ctx context.Context, id string, body []byte) (inbox.Outcome, error)

func runNATS(ctx context.Context, logger *log.Logger, url string, ackWait time.Duration, consumer string, concurrency int, policy broker.Policy, book bookFunc) error {
	nc, err := nats.Connect(url, nats.Name("payments-consumer"))
	if err != nil {
		return fmt.Errorf("--broker: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{subject}, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("stream %s: %w", streamName, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, streamName, jetstream.ConsumerConfig{
		Durable: consumer, FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: 256,
	})
	if err != nil {
		return fmt.Errorf("consumer %s: %w", consumer, err)
	}
	h, err := natsidem.InboxHandler(natsidem.Config{Scope: consumer, Key: broker.JSONKey("correlation_id"), Policy: policy,
		ProgressInterval: max(ackWait/3, time.Second), Context: context.WithoutCancel(ctx), Concurrency: concurrency},
		func(ctx context.Context, msg jetstream.Msg, id string) (inbox.Outcome, error) {
			return book(ctx, id, msg.Data())
		})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(h)
	if err != nil {
		return err
	}
	logger.Printf("consuming %s (stream %s) as %s", subject, streamName, consumer)
	<-ctx.Done()
	cc.Drain() // finish the messages in hand
	<-cc.Closed()
	return nil
}

func runAMQP(ctx context.Context, logger *log.Logger, url, consumer string, concurrency int, policy broker.Policy, book bookFunc) error {
	// A wrong --broker fails at once; afterwards the consumer rides out
	// broker restarts and lost connections (amqp091-go does not reconnect).
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("--broker: %w", err)
	}
	conn.Close()
	h, err := amqpidem.InboxHandler(amqpidem.Config{Scope: consumer, Key: broker.JSONKey("correlation_id"), Policy: policy, Context: context.WithoutCancel(ctx), Concurrency: concurrency},
		func(ctx context.Context, d *amqp.Delivery, id string) (inbox.Outcome, error) {
			return book(ctx, id, d.Body)
		})
	if err != nil {
		return err
	}
	logger.Printf("consuming queue %s as %s", queueName, consumer)
	return amqpidem.ConsumeRedialing(ctx, amqpidem.Redialing{
		URL: url,
		Setup: func(ch *amqp.Channel) error { // on every connection: the queue, the prefetch
			if _, err := ch.QueueDeclare(queueName, true, false, false, false, nil); err != nil {
				return fmt.Errorf("queue %s: %w", queueName, err)
			}
			return ch.Qos(max(64, concurrency), 0, false)
		},
		OnError: func(err error) { logger.Printf("%v; connecting again", err) },
	}, queueName, consumer, h)
}

// runKafka consumes the topic in the consumer group named consumer. The key
// is the instruction's correlation id, as on every broker: the business
// intent's id, not an outbox row's key (Idempotency-Key), which two rows of
// one instruction do not share.
func runKafka(ctx context.Context, logger *log.Logger, url string, session time.Duration, consumer string, concurrency int, policy broker.Policy, book bookFunc) error {
	brokers, topic, err := kafkasender.ParseDestination(url)
	if err != nil {
		return fmt.Errorf("--broker: %w", err)
	}
	c, err := kafkaidem.InboxConsumer(kafkaidem.Config{
		Scope: consumer, Policy: policy, Context: context.WithoutCancel(ctx), Concurrency: concurrency,
		Key: broker.JSONKey("correlation_id"),
		ClientOptions: []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(consumer), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(session), kgo.HeartbeatInterval(session / 4)},
		OnError: func(err error) { logger.Print(err) },
	}, func(ctx context.Context, rec *kgo.Record, id string) (inbox.Outcome, error) {
		return book(ctx, id, rec.Value)
	})
	if err != nil {
		return err
	}
	logger.Printf("consuming topic %s as group %s", topic, consumer)
	return c.Run(ctx) // on SIGTERM: finishes the records in flight, commits, leaves the group
}

// runSQS consumes the queue named in sqs://QUEUE-NAME (made if missing,
// with QUEUE-NAME-dlq for its dead letters; a FIFO queue's name ends in
// .fifo), in the region, with the credentials and at the endpoint of the
// standard AWS configuration. The visibility timeout is --ack-wait. The
// key is the instruction's correlation id, as on every broker.
func runSQS(ctx context.Context, logger *log.Logger, url string, ackWait time.Duration, consumer string, concurrency int, policy broker.Policy, book bookFunc) error {
	name, err := sqssender.ParseDestination(url)
	if err != nil {
		return fmt.Errorf("--broker: %w", err)
	}
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return fmt.Errorf("the AWS configuration: %w", err)
	}
	client := sqs.NewFromConfig(awsCfg)
	fifo := strings.HasSuffix(name, ".fifo")
	queue := func(name string) (string, error) {
		in := &sqs.CreateQueueInput{QueueName: aws.String(name)}
		if fifo {
			in.Attributes = map[string]string{string(sqstypes.QueueAttributeNameFifoQueue): "true"}
		}
		out, err := client.CreateQueue(ctx, in) // returns the queue's URL if it exists with these attributes
		if err != nil {
			return "", fmt.Errorf("queue %s: %w", name, err)
		}
		return *out.QueueUrl, nil
	}
	queueURL, err := queue(name)
	if err != nil {
		return err
	}
	dlqURL, err := queue(strings.TrimSuffix(name, ".fifo") + "-dlq" + map[bool]string{true: ".fifo"}[fifo])
	if err != nil {
		return err
	}
	c, err := sqsidem.InboxConsumer(sqsidem.Config{
		Client: client, QueueURL: queueURL, DeadLetterQueueURL: dlqURL, Scope: consumer, Policy: policy,
		Key: broker.JSONKey("correlation_id"), Concurrency: concurrency, VisibilityTimeout: max(ackWait, time.Second),
		Context: context.WithoutCancel(ctx), OnError: func(err error) { logger.Print(err) },
	}, func(ctx context.Context, m *sqsidem.Message, id string) (inbox.Outcome, error) {
		return book(ctx, id, m.Data)
	})
	if err != nil {
		return err
	}
	logger.Printf("consuming queue %s as %s", name, consumer)
	return c.Run(ctx) // on SIGTERM: finishes the messages in hand, deletes what settled
}
