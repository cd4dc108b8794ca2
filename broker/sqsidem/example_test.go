package sqsidem_test

import (
	"context"
	"log"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/sqsidem"
	"github.com/idemgo/idem/store/storeurl"
)

// A consumer of an SQS queue whose work runs once per correlation_id,
// however often the message is delivered. This example only compiles: it
// needs SQS (the tests run the same calls against an emulator).
func ExampleGuardConsumer() {
	ctx := context.Background()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	client := sqs.NewFromConfig(awsCfg)
	queueURL, deadLetterURL := queueURLOf(ctx, client, "payments"), queueURLOf(ctx, client, "payments-dlq")
	store, err := storeurl.Open(ctx, "redis://redis.internal:6379/0", nil) // every consumer shares it
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	guard, err := idem.NewGuard(idem.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	cons, err := sqsidem.GuardConsumer(guard, sqsidem.Config{
		Client:             sqs.NewFromConfig(awsCfg), // config.LoadDefaultConfig: region, credentials, endpoint
		QueueURL:           queueURL,
		DeadLetterQueueURL: deadLetterURL, // or leave it to the queue's redrive policy
		Scope:              "credit-transfers",
		Key:                broker.JSONKey("correlation_id"), // default: the Idempotency-Key attribute
		Concurrency:        8,
	}, func(ctx context.Context, m *sqsidem.Message, fence uint64) ([]byte, error) {
		return nil, book(ctx, m.Data, fence)
	})
	if err != nil {
		log.Fatal(err)
	}
	err = cons.Run(ctx) // until ctx ends; then finishes the messages in hand and their deletes
	if err != nil {
		log.Fatal(err)
	}
}

func queueURLOf(ctx context.Context, c *sqs.Client, name string) string {
	out, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		log.Fatal(err)
	}
	return *out.QueueUrl
}

// book is the business step: a booking written under the fence.
func book(context.Context, []byte, uint64) error { return nil }
