package testenv

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// TestSQSReachedTheStandardWay: the SQS the tests use is reached through
// config.LoadDefaultConfig (AWS_ENDPOINT_URL_SQS), and a message sent is
// received.
func TestSQSReachedTheStandardWay(t *testing.T) {
	c := SQSClient(t)
	url := SQSQueue(t, c, "idem-testenv-", nil)
	ctx := context.Background()
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("hello")}); err != nil {
		t.Fatal(err)
	}
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), WaitTimeSeconds: 5})
	if err != nil || len(out.Messages) != 1 || *out.Messages[0].Body != "hello" {
		t.Fatalf("received %+v, %v", out, err)
	}
}
