// Command relaybench measures, in one run, relay throughput from PostgreSQL
// to NATS JetStream for idem's outbox relay — the rows without ordering
// keys, then the same number spread over -ordering-keys ordering keys — and
// for Watermill's SQL forwarder (watermill-sql subscriber → forwarder → a
// JetStream publisher), on the same number of rows with the same payloads,
// and prints the ratios. Run it through scripts/bench-relay.sh.
package main
