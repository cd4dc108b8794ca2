package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/sqssender"
	"github.com/idemgo/idem/scripts/internal/httpcalls"
	"github.com/idemgo/idem/scripts/internal/proccpu"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

// benchSQS relays n rows from a fresh outbox table to a fresh SQS queue
// with idem's relay, then sends the same rows, read from the table, with a
// bare loop of SendMessageBatch calls (ten rows each, concurrency calls at
// once); each run ends when the queue holds every message.
func benchSQS(ctx context.Context, pool *pgxpool.Pool, endpoint string, n, concurrency, batch int) {
	cfg, err := config.LoadDefaultConfig(ctx)
	check(err)
	calls := httpcalls.NewCounter(http.DefaultTransport)
	c := sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.HTTPClient = &http.Client{Transport: calls}
	})
	newQueue := func(name string) (string, string) {
		name = fmt.Sprintf("relaybench-%s-%d", name, time.Now().UnixNano())
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
		check(err)
		return name, *out.QueueUrl
	}
	waitQueue := func(url string) {
		for {
			out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
				AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}})
			check(err)
			if k, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)]); k >= n {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	payload := []byte(`{"order":"ORD-20261129-0001","lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total_cents":12900}`)
	s, err := outbox.New(pgxv5.New(pool), outbox.Config{Schema: "relaybench"})
	check(err)
	check(s.Migrate(ctx))
	_, err = pool.Exec(ctx, `TRUNCATE relaybench.idem_outbox`)
	check(err)
	name, idemURL := newQueue("idem")
	defer c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(idemURL)})
	rows := make([][]any, n)
	for i := range rows {
		rows[i] = []any{"ORD-" + strconv.Itoa(i), "sqs://" + name, payload, "{}"}
	}
	_, err = pool.CopyFrom(ctx, pgx.Identifier{"relaybench", "idem_outbox"}, []string{"key", "destination", "payload", "headers"}, pgx.CopyFromRows(rows))
	check(err)
	_, err = pool.Exec(ctx, `ANALYZE relaybench.idem_outbox`)
	check(err)

	log.Printf("idem relay → SQS: %d rows", n)
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: s.Store, Sender: outbox.Router{"sqs": sqssender.New(sqssender.Config{Client: c})},
		Batch: batch, Concurrency: concurrency, BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	check(err)
	calls.Reset()
	cpu0 := proccpu.Seconds()
	start := time.Now()
	relayAll(ctx, r, s.Store)
	waitQueue(idemURL)
	idemRate, idemCPU := float64(n)/time.Since(start).Seconds(), proccpu.PerMessage(cpu0, proccpu.Seconds(), float64(n))+"; calls per message: "+calls.Per(n)

	log.Printf("bare SendMessageBatch: %d rows", n)
	_, bareURL := newQueue("bare")
	defer c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(bareURL)})
	calls.Reset()
	cpu0 = proccpu.Seconds()
	start = time.Now()
	dbRows, err := pool.Query(ctx, `SELECT key, payload FROM relaybench.idem_outbox ORDER BY id`)
	check(err)
	batches := make(chan []types.SendMessageBatchRequestEntry, concurrency)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for entries := range batches {
				_, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(bareURL), Entries: entries})
				check(err)
			}
		}()
	}
	var entries []types.SendMessageBatchRequestEntry
	for dbRows.Next() {
		var key string
		var body []byte
		check(dbRows.Scan(&key, &body))
		entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(len(entries))), MessageBody: aws.String(string(body)),
			MessageAttributes: map[string]types.MessageAttributeValue{sqssender.KeyAttribute: {DataType: aws.String("String"), StringValue: aws.String(key)}}})
		if len(entries) == 10 {
			batches <- entries
			entries = nil
		}
	}
	check(dbRows.Err())
	if len(entries) > 0 {
		batches <- entries
	}
	close(batches)
	wg.Wait()
	waitQueue(bareURL)
	bareRate, bareCPU := float64(n)/time.Since(start).Seconds(), proccpu.PerMessage(cpu0, proccpu.Seconds(), float64(n))+"; calls per message: "+calls.Per(n)

	fmt.Printf("== %d rows, PostgreSQL → SQS at %s, %d sends at once\n", n, endpoint, concurrency)
	fmt.Printf("bare SendMessageBatch loop  %8.0f msg/s  1.00\n  %s\n", bareRate, bareCPU)
	fmt.Printf("idem relay                  %8.0f msg/s  %.2f (target ≥ 0.8)\n  %s\n", idemRate, idemRate/bareRate, idemCPU)
}
