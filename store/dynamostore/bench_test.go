package dynamostore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/storetest"
)

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, func(t testing.TB) store.Store { return newStore(t, nil) })
}

// BenchmarkBare is what the store's lifecycles and replays are measured
// against: a loop of the same two conditional writes (a PutItem if the key
// is absent, an UpdateItem on its fence) and of consistent GetItems, with
// aws-sdk-go-v2 on the same endpoint and concurrency.
func BenchmarkBare(b *testing.B) {
	c := testenv.DynamoDBClient(b)
	table := newTable(b)
	item := func(key string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: key}, "v": &types.AttributeValueMemberN{Value: "1"},
			"st": &types.AttributeValueMemberN{Value: "1"}, "f": &types.AttributeValueMemberN{Value: "1796606160088000"},
			"fp": &types.AttributeValueMemberS{Value: "fp"}, "at": &types.AttributeValueMemberN{Value: "1"},
			"lu": &types.AttributeValueMemberN{Value: "1796606220088"}, "ex": &types.AttributeValueMemberN{Value: "1796609760088"},
			"up": &types.AttributeValueMemberN{Value: "1796606160088"}, "ttl": &types.AttributeValueMemberN{Value: "1796609761"}}
	}
	b.Run("Lifecycle", func(b *testing.B) {
		var seq atomic.Uint64
		prefix := testenv.RandomName("life-") // each run of the function its own keys
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				key := prefix + strconv.FormatUint(seq.Add(1), 10)
				if _, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item(key), ConditionExpression: aws.String("attribute_not_exists(k)")}); err != nil {
					b.Fatal(err)
				}
				if _, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: table, Key: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: key}},
					ConditionExpression: aws.String("#st = :fl AND #f = :f"), UpdateExpression: aws.String("SET #st = :done, #r = :r, #v = #v + :one"),
					ExpressionAttributeNames: map[string]string{"#st": "st", "#f": "f", "#r": "r", "#v": "v"},
					ExpressionAttributeValues: map[string]types.AttributeValue{":fl": &types.AttributeValueMemberN{Value: "1"}, ":f": &types.AttributeValueMemberN{Value: "1796606160088000"},
						":done": &types.AttributeValueMemberN{Value: "2"}, ":r": &types.AttributeValueMemberB{Value: []byte(`{"ok":true}`)}, ":one": &types.AttributeValueMemberN{Value: "1"}}}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lifecycles/s")
	})
	// LifecycleAsTheStore sends the requests the store sends — its
	// conditions (the retention checked on every write), its updates (the
	// version, the retention and the TTL attribute moved) and its ALL_OLD —
	// so that Lifecycle against it is the server's cost of those
	// semantics, and the store against it the client's own.
	b.Run("LifecycleAsTheStore", func(b *testing.B) {
		var seq atomic.Uint64
		prefix := testenv.RandomName("same-")
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				key := prefix + strconv.FormatUint(seq.Add(1), 10)
				if _, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item(key), ConditionExpression: aws.String("attribute_not_exists(#k)"),
					ExpressionAttributeNames: map[string]string{"#k": "k"}, ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld}); err != nil {
					b.Fatal(err)
				}
				if _, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: table, Key: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: key}},
					ConditionExpression:      aws.String("#st = :fl AND #f = :fence AND #ex > :now"),
					UpdateExpression:         aws.String("SET #v = #v + :one, #st = :st, #ex = :ex, #ttl = :ttl, #up = :now, #r = :r"),
					ExpressionAttributeNames: map[string]string{"#st": "st", "#f": "f", "#ex": "ex", "#v": "v", "#ttl": "ttl", "#up": "up", "#r": "r"},
					ExpressionAttributeValues: map[string]types.AttributeValue{":fl": &types.AttributeValueMemberN{Value: "1"}, ":fence": &types.AttributeValueMemberN{Value: "1796606160088000"},
						":now": &types.AttributeValueMemberN{Value: "1796606160088"}, ":one": &types.AttributeValueMemberN{Value: "1"},
						":st": &types.AttributeValueMemberN{Value: "2"}, ":ex": &types.AttributeValueMemberN{Value: "1796609760088"},
						":ttl": &types.AttributeValueMemberN{Value: "1796609761"}, ":r": &types.AttributeValueMemberB{Value: []byte(`{"ok":true}`)}}}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lifecycles/s")
	})
	b.Run("Replay", func(b *testing.B) {
		ctx := context.Background()
		if _, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item("replay")}); err != nil {
			b.Fatal(err)
		}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, ConsistentRead: aws.Bool(true),
					Key: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: "replay"}}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
