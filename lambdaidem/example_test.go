package lambdaidem_test

import (
	"context"
	"log"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/lambdaidem"
	"github.com/idemgo/idem/store/storeurl"
)

// The main of a Lambda function fed by an SQS queue: each record is
// booked once per Idempotency-Key, however often SQS delivers it, and
// the batch response names the records that must come back. This example
// only compiles: lambda.Start needs the Lambda runtime.
func ExampleGuardSQS() {
	ctx := context.Background()
	store, err := storeurl.Open(ctx, "redis://cache.internal:6379/0", nil) // every instance shares it
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.NewGuard(idem.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	h, err := lambdaidem.GuardSQS(guard, lambdaidem.Config{Scope: "credit-transfers"},
		func(ctx context.Context, r *lambdaidem.Record, fence uint64) ([]byte, error) {
			return nil, book(ctx, r.Data, fence)
		})
	if err != nil {
		log.Fatal(err)
	}
	lambda.Start(h)
}

// book is the business step: a booking written under the fence.
func book(context.Context, []byte, uint64) error { return nil }

// The main of a Lambda function behind an API Gateway REST API: a POST
// with an Idempotency-Key creates one order however often the client
// retries, and a retry is answered the first response. This example only
// compiles: lambda.Start needs the Lambda runtime.
func ExampleAPIGatewayProxy() {
	store, err := storeurl.Open(context.Background(), "redis://cache.internal:6379/0", nil) // every instance shares it
	if err != nil {
		log.Fatal(err)
	}
	h, err := lambdaidem.APIGatewayProxy(lambdaidem.HTTPConfig{
		HTTP: httpidem.Config{Store: store, Principal: lambdaidem.AuthorizerPrincipal}, // the caller as the authorizer named it
	}, createOrder)
	if err != nil {
		log.Fatal(err)
	}
	lambda.Start(h)
}

// createOrder is the function's own handler.
func createOrder(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
	return events.APIGatewayProxyResponse{StatusCode: 201, Body: `{"order":"ORD-1"}`}, nil
}
