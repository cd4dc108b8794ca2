// Command lambda-sqs is an AWS Lambda function fed by an SQS queue, made
// idempotent by lambdaidem: each record credits an account once per
// Idempotency-Key, however often SQS delivers it, and the function answers
// with the records that must come back (partial batch responses).
//
// Records are {"account":"ACC-1","amount_cents":2500}; a credit is a line
// appended to the file LEDGER (default /tmp/ledger.txt). The store is
// IDEM_STORE (default sqlite:/tmp/idem.db); on AWS, one that every
// instance of the function reaches: redis://… or postgres://…. The credits
// of the account SLOW_ACCOUNT, if set, never end — to try what a timed-out
// invocation leaves behind.
//
// Build it as Lambda runs Go (the provided.al2023 runtime):
//
//	GOOS=linux go build -tags lambda.norpc -o bootstrap ./examples/lambda-sqs
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sync"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/lambdaidem"
	"github.com/idemgo/idem/store/storeurl"
)

// Credit is one record's instruction.
type Credit struct {
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	ctx := context.Background()
	store, err := storeurl.Open(ctx, env("IDEM_STORE", "sqlite:/tmp/idem.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.NewGuard(idem.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	ledger, slow := env("LEDGER", "/tmp/ledger.txt"), os.Getenv("SLOW_ACCOUNT")
	var mu sync.Mutex
	h, err := lambdaidem.GuardSQS(guard, lambdaidem.Config{Scope: "credits"},
		func(ctx context.Context, r *lambdaidem.Record, fence uint64) ([]byte, error) {
			var c Credit
			if err := json.Unmarshal(r.Data, &c); err != nil {
				return nil, idem.Permanent(fmt.Errorf("record %s: %w", r.MessageId, err))
			}
			if slow != "" && c.Account == slow {
				<-ctx.Done() // longer than the invocation has
				return nil, ctx.Err()
			}
			mu.Lock()
			defer mu.Unlock()
			f, err := os.OpenFile(ledger, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			_, err = fmt.Fprintf(f, "%s %d %s fence=%d\n", c.Account, c.AmountCents, r.Header(lambdaidem.KeyAttribute), fence)
			return []byte("credited"), err
		})
	if err != nil {
		log.Fatal(err)
	}
	lambda.Start(h)
}
