package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/sqsidem"
	"github.com/idemgo/idem/scripts/internal/httpcalls"
	"github.com/idemgo/idem/scripts/internal/proccpu"
	"github.com/idemgo/idem/store/memstore"
)

// benchSQS runs the comparison on SQS: a fresh standard queue of n
// messages per configuration (and its dead-letter queue), consumed by a
// bare loop of workers goroutines that each receive up to ten messages and
// delete them in one DeleteMessageBatch, and by sqsidem over a Guard on the
// memory store with Concurrency workers.
func benchSQS(ctx context.Context, endpoint string, n, workers int) {
	cfg, err := config.LoadDefaultConfig(ctx)
	check(err)
	calls := httpcalls.NewCounter(http.DefaultTransport)
	c := sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.HTTPClient = &http.Client{Transport: calls}
	})
	queue := func(name string) string {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(fmt.Sprintf("consumebench-%s-%d", name, time.Now().UnixNano()))})
		check(err)
		return *out.QueueUrl
	}
	fill := func(url string) {
		var wg sync.WaitGroup
		batches := make(chan int)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b := range batches {
					var entries []types.SendMessageBatchRequestEntry
					for i := b; i < min(b+10, n); i++ {
						id := "PAY-" + strconv.Itoa(i)
						entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i - b)),
							MessageBody: aws.String(`{"correlation_id":"` + id + `"}`),
							MessageAttributes: map[string]types.MessageAttributeValue{
								sqsidem.KeyAttribute: {DataType: aws.String("String"), StringValue: aws.String(id)}}})
					}
					_, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
					check(err)
				}
			}()
		}
		for b := 0; b < n; b += 10 {
			batches <- b
		}
		close(batches)
		wg.Wait()
	}
	// run fills a queue, then measures consume from start to the last of
	// n messages done — deleted: for sqsidem, whose deletes follow its
	// decisions in batches, until its Run returned with every delete made.
	run := func(name string, consume func(url, dlq string, done func()) (stop func())) float64 {
		url, dlq := queue(name), queue(name+"-dlq")
		defer c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
		defer c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(dlq)})
		fill(url)
		var count atomic.Int64
		finished := make(chan struct{})
		done := func() {
			if count.Add(1) == int64(n) {
				close(finished)
			}
		}
		calls.Reset()
		cpu0 := proccpu.Seconds()
		start := time.Now()
		stop := consume(url, dlq, done)
		<-finished
		elapsed := time.Since(start)
		if name == "sqsidem" {
			stop()
			elapsed = time.Since(start)
		} else {
			stop()
		}
		cpu[name] = proccpu.PerMessage(cpu0, proccpu.Seconds(), float64(n)) + "; calls per message: " + calls.Per(n)
		return float64(n) / elapsed.Seconds()
	}
	bare := run("bare", func(url, _ string, done func()) func() {
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10,
						WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
					if err != nil || len(out.Messages) == 0 {
						continue
					}
					entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
					for i, m := range out.Messages {
						entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
					}
					if _, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries}); err == nil {
						for range out.Messages {
							done()
						}
					}
				}
			}()
		}
		return func() { cancel(); wg.Wait() }
	})
	idemRate := run("sqsidem", func(url, dlq string, done func()) func() {
		g, err := idem.NewGuard(idem.Config{Store: memstore.New(memstore.Config{})})
		check(err)
		cons, err := sqsidem.GuardConsumer(g, sqsidem.Config{Client: c, QueueURL: url, DeadLetterQueueURL: dlq, Scope: "bench",
			Concurrency: workers, WaitTime: time.Second,
			OnDecision: func(*sqsidem.Message, broker.Decision) { done() }},
			func(ctx context.Context, m *sqsidem.Message, fence uint64) ([]byte, error) { return nil, nil })
		check(err)
		ctx, cancel := context.WithCancel(ctx)
		finished := make(chan struct{})
		go func() { check(cons.Run(ctx)); close(finished) }()
		return func() { cancel(); <-finished }
	})
	fmt.Printf("== %d messages, a standard SQS queue at %s, %d at once\n", n, endpoint, workers)
	fmt.Printf("%-62s %8.0f msg/s  1.00\n", "bare: receive 10, DeleteMessageBatch", bare)
	fmt.Printf("  %s\n", cpu["bare"])
	fmt.Printf("%-62s %8.0f msg/s  %.2f\n", "sqsidem + memstore", idemRate, idemRate/bare)
	fmt.Printf("  %s\n", cpu["sqsidem"])
}
