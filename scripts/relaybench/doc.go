// Command relaybench measures, in one run, relay throughput from PostgreSQL
// to NATS JetStream for idem's outbox relay — the rows without ordering
// keys, then the same number spread over -ordering-keys ordering keys — and
// for Watermill's SQL forwarder (watermill-sql subscriber → forwarder → a
// JetStream publisher), on the same number of rows with the same payloads,
// and prints the ratios. Run it through scripts/bench-relay.sh.
//
// With -sqs ENDPOINT it measures instead the relay to Amazon SQS (an
// emulator's endpoint) next to a bare loop that reads the same rows and
// sends them with SendMessageBatch, ten at a time, as many calls at once
// as the relay has sends.
package main
