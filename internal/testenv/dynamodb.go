package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// DynamoDBEndpointEnv names the DynamoDB endpoint the tests use instead of
// starting dynalite: real DynamoDB (with the standard AWS credentials and
// region in the environment), DynamoDB Local, another emulator.
const DynamoDBEndpointEnv = "IDEM_DYNAMODB_ENDPOINT"

// DynaliteEnv names the dynalite executable; by default
// $XDG_CACHE_HOME/idem-npm/node_modules/.bin/dynalite, where .ci/run
// installs it (npm i dynalite).
const DynaliteEnv = "IDEM_DYNALITE"

var dynamoOnce struct {
	sync.Mutex
	endpoint string
	err      error
}

// survivingAbortedRequests runs dynalite's command (%q: its cli.js) so
// that a request its client aborts mid-body — a connection the campaigns'
// proxy cuts — does not end the process: dynalite rethrows the request's
// ECONNRESET, which Node makes fatal.
const survivingAbortedRequests = `process.on('uncaughtException', (e) => {
	if (e && e.code === 'ECONNRESET') return;
	console.error(e);
	process.exit(1);
});
process.argv.splice(1, 0, 'dynalite');
require(%q);`

// DynamoDB makes the tests' DynamoDB reachable through the standard AWS
// configuration and returns its endpoint: the one IDEM_DYNAMODB_ENDPOINT
// names, else a dynalite this process starts once (in memory, tables made
// at once; on a free loopback port, killed when the process ends). It sets
// AWS_ENDPOINT_URL_DYNAMODB — and, for dynalite, a region and credentials
// where none are set — in this process's environment.
func DynamoDB(t testing.TB) string {
	t.Helper()
	dynamoOnce.Lock()
	defer dynamoOnce.Unlock()
	if dynamoOnce.endpoint == "" && dynamoOnce.err == nil {
		if ep := os.Getenv(DynamoDBEndpointEnv); ep != "" {
			dynamoOnce.endpoint = ep
		} else {
			dynamoOnce.endpoint, dynamoOnce.err = startNPMServer(t, "dynalite", DynaliteEnv, func(bin string, port int) (string, []string, []string) {
				cli, err := filepath.EvalSymlinks(bin)
				if err != nil {
					cli = bin
				}
				return "node", []string{"-e", fmt.Sprintf(survivingAbortedRequests, cli), "--",
					"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"}, nil
			})
		}
		if dynamoOnce.err == nil {
			os.Setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamoOnce.endpoint)
			os.Setenv(DynamoDBEndpointEnv, dynamoOnce.endpoint)
		}
	}
	Need(t, "DynamoDB (dynalite)", DynaliteEnv, dynamoOnce.err)
	return dynamoOnce.endpoint
}

// DynamoDBClient returns a client of the tests' DynamoDB, configured the
// standard way (config.LoadDefaultConfig).
func DynamoDBClient(t testing.TB) *dynamodb.Client {
	t.Helper()
	DynamoDB(t)
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dynamodb.NewFromConfig(cfg)
}
