// Package watermillidem is a Watermill handler middleware that runs every
// message through an idem.Guard, so any Watermill Pub/Sub (Kafka, SQS, Google
// Pub/Sub, AMQP, SQL, GoChannel…) gets idempotent consumers.
//
// Unlike Watermill's own Deduplicator, which remembers a message as soon as it
// arrives, it never drops a redelivery after a failed attempt: a handler
// error releases the key (unless the error is idem.Permanent or
// idem.Ambiguous), the message is nacked, and the redelivery runs again. A
// duplicate of a completed message is acked without running the handler; a
// duplicate of one in progress elsewhere is nacked, to come back later.
package watermillidem
