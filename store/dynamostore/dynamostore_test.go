package dynamostore_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/dynamostore"
	"github.com/idemgo/idem/store/storetest"
)

// newStore returns a store on a table of its own, made by Migrate and
// deleted when t ends.
func newStore(t testing.TB, clock idem.Clock) store.Store {
	c := testenv.DynamoDBClient(t)
	table := testenv.RandomName("idem_records_")
	s, err := dynamostore.New(dynamostore.Config{Client: c, Table: table, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}) })
	return s
}

// TestConformance runs the suite on the store's injected clock: the lease
// and retention cases advance it instead of sleeping.
func TestConformance(t *testing.T) {
	storetest.RunClocked(t, storetest.Capabilities{Persistent: true, Unclaims: true, FencedDeletes: true}, newStore)
}
