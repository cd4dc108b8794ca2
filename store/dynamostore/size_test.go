package dynamostore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/dynamostore"
	"github.com/idemgo/idem/store/storetest"
)

// itemSize is an item's size as DynamoDB bills it: each attribute's name
// and value — a string's and a binary's bytes, a number's significant
// digits halved, plus one.
func itemSize(item map[string]types.AttributeValue) int64 {
	var n int64
	for name, v := range item {
		n += int64(len(name))
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			n += int64(len(v.Value))
		case *types.AttributeValueMemberB:
			n += int64(len(v.Value))
		case *types.AttributeValueMemberN:
			digits := strings.TrimLeft(strings.TrimLeft(v.Value, "-"), "0")
			n += int64((len(digits)+1)/2 + 1)
		}
	}
	return n
}

// TestRecordBytes reports a completed record's item size as DynamoDB
// bills it (what storage and write units are counted from).
func TestRecordBytes(t *testing.T) {
	c, table := testenv.DynamoDBClient(t), newTable(t)
	s, err := dynamostore.New(dynamostore.Config{Client: c, Table: *table})
	if err != nil {
		t.Fatal(err)
	}
	storetest.RecordBytes(t, s, "DynamoDB item size", func(key string) (int64, error) {
		out, err := c.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: table,
			Key: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: key}}, ConsistentRead: aws.Bool(true)})
		if err != nil {
			return 0, err
		}
		return itemSize(out.Item), nil
	})
}
