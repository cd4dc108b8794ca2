package dynamostore_test

import (
	"context"
	"log"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/dynamostore"
)

// A store on a DynamoDB table, reached the standard AWS way. This example
// only compiles: it needs DynamoDB (the tests run the same calls against
// an emulator).
func ExampleNew() {
	ctx := context.Background()
	awsCfg, err := config.LoadDefaultConfig(ctx) // region, credentials, endpoint
	if err != nil {
		log.Fatal(err)
	}
	store, err := dynamostore.New(dynamostore.Config{Client: dynamodb.NewFromConfig(awsCfg), Table: "idem_records"}) // URL: dynamodb://idem_records
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // creates the table, turns TTL on: or idem migrate
		log.Fatal(err)
	}
	guard, err := idem.NewGuard(idem.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	_ = guard
}
