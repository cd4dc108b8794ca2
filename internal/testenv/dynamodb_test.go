package testenv

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// TestDynaliteSurvivesAnAbortedRequest: a request whose client goes away
// mid-body (as the campaigns' proxy cuts one) leaves the tests' DynamoDB
// answering the next.
func TestDynaliteSurvivesAnAbortedRequest(t *testing.T) {
	c := DynamoDBClient(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(DynamoDB(t), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-amz-json-1.0\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 100\r\n\r\n{\"Li"))
	conn.(*net.TCPConn).SetLinger(0) // a reset, as a cut proxy's
	conn.Close()
	for range 3 {
		if _, err := c.ListTables(context.Background(), &dynamodb.ListTablesInput{}); err != nil {
			t.Fatalf("after an aborted request: %v", err)
		}
	}
}
