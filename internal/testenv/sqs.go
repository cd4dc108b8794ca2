package testenv

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// SQSEndpointEnv names the SQS endpoint the tests use instead of starting
// fauxqs: real SQS (https://sqs.REGION.amazonaws.com, with the standard AWS
// credentials and region in the environment), LocalStack, another
// emulator.
const SQSEndpointEnv = "IDEM_SQS_ENDPOINT"

// FauxqsEnv names the fauxqs executable; by default
// $XDG_CACHE_HOME/idem-npm/node_modules/.bin/fauxqs, where .ci/run installs
// it (npm i fauxqs).
const FauxqsEnv = "IDEM_FAUXQS"

var sqsOnce struct {
	sync.Mutex
	endpoint string
	err      error
}

// SQS makes the tests' SQS reachable through the standard AWS
// configuration and returns its endpoint: the one IDEM_SQS_ENDPOINT names,
// else a fauxqs this process starts once (on a free loopback port; killed
// when the process ends, also by SIGKILL). It sets AWS_ENDPOINT_URL_SQS —
// and, for fauxqs, a region and credentials where none are set — in this
// process's environment, so that config.LoadDefaultConfig, here and in the
// processes the tests start, reaches it.
func SQS(t testing.TB) string {
	t.Helper()
	sqsOnce.Lock()
	defer sqsOnce.Unlock()
	if sqsOnce.endpoint == "" && sqsOnce.err == nil {
		sqsOnce.endpoint, sqsOnce.err = sqsEndpoint(t)
	}
	Need(t, "SQS (fauxqs)", FauxqsEnv, sqsOnce.err)
	return sqsOnce.endpoint
}

func sqsEndpoint(t testing.TB) (string, error) {
	if ep := os.Getenv(SQSEndpointEnv); ep != "" {
		os.Setenv("AWS_ENDPOINT_URL_SQS", ep)
		return ep, nil
	}
	endpoint, err := startNPMServer(t, "fauxqs", FauxqsEnv, func(bin string, port int) (string, []string, []string) {
		return bin, nil, []string{"FAUXQS_PORT=" + strconv.Itoa(port), "FAUXQS_LOGGER=false", "FAUXQS_HOST=127.0.0.1"}
	})
	if err != nil {
		return "", err
	}
	os.Setenv("AWS_ENDPOINT_URL_SQS", endpoint)
	os.Setenv(SQSEndpointEnv, endpoint) // the processes the tests start use this one
	return endpoint, nil
}

// SQSClient returns a client of the tests' SQS, configured the standard
// way (config.LoadDefaultConfig).
func SQSClient(t testing.TB) *sqs.Client {
	t.Helper()
	SQS(t)
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return sqs.NewFromConfig(cfg)
}

// SQSQueue creates a queue named prefix plus a random suffix (".fifo"
// appended for a FIFO queue: attrs holds FifoQueue) and returns its URL;
// it is deleted when t ends.
func SQSQueue(t testing.TB, c *sqs.Client, prefix string, attrs map[string]string) string {
	t.Helper()
	name := RandomName(prefix)
	if attrs[string(types.QueueAttributeNameFifoQueue)] == "true" {
		name += ".fifo"
	}
	out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("creating queue %s: %v", name, err)
	}
	t.Cleanup(func() { _, _ = c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl}) })
	return *out.QueueUrl
}
