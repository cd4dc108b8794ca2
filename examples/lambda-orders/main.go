// Command lambda-orders is an AWS Lambda function behind an HTTP API
// (API Gateway, payload format 2.0) that creates an order once per
// Idempotency-Key, its records in DynamoDB: a client that retries a POST
// /orders after a timeout gets the first answer, replayed, and no second
// order; the same key with another body is refused (422); while the first
// runs, a duplicate is told to retry (409).
//
// The table is TABLE (default idem_records), in the region and at the
// endpoint of the standard AWS configuration; the caller is the JWT
// authorizer's subject, else the Authorization header.
//
//	GOOS=linux go build -tags lambda.norpc -o bootstrap ./examples/lambda-orders
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"sync/atomic"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/lambdaidem"
	"github.com/idemgo/idem/store/dynamostore"
)

// Order is what POST /orders takes.
type Order struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// orders counts the orders this instance created (a real function writes
// them to its own table).
var orders atomic.Int64

// createOrder is the function's own handler, unaware of idempotency.
func createOrder(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	var o Order
	if err := json.Unmarshal([]byte(ev.Body), &o); err != nil || o.SKU == "" || o.Qty < 1 {
		return events.APIGatewayV2HTTPResponse{StatusCode: http.StatusBadRequest, Body: `{"error":"want {\"sku\":…,\"qty\":…}"}`}, nil
	}
	n := orders.Add(1)
	return events.APIGatewayV2HTTPResponse{StatusCode: http.StatusCreated, Headers: map[string]string{"Content-Type": "application/json"},
		Body: fmt.Sprintf(`{"order":"ORD-%d","sku":%q,"qty":%d}`, n, o.SKU, o.Qty)}, nil
}

// handler is createOrder made idempotent on the table.
func handler(ctx context.Context, table string) (func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error), error) {
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, err
	}
	store, err := dynamostore.New(dynamostore.Config{Client: dynamodb.NewFromConfig(awsCfg), Table: table})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil { // at deployment, with idem migrate, where the function's role may not create tables
		return nil, err
	}
	return lambdaidem.APIGatewayV2(lambdaidem.HTTPConfig{HTTP: httpidem.Config{Store: store, Principal: lambdaidem.AuthorizerPrincipal}}, createOrder)
}

func main() {
	table := os.Getenv("TABLE")
	if table == "" {
		table = "idem_records"
	}
	h, err := handler(context.Background(), table)
	if err != nil {
		log.Fatal(err)
	}
	lambda.Start(h)
}
