// Package sqsidem runs Amazon SQS messages through idem's Guard
// (GuardConsumer) or the transactional inbox (InboxConsumer): a
// duplicate — a redelivery after a crash between the work and the delete,
// a producer's resend — is deleted without running the work again.
//
// A Consumer long-polls one queue, ten messages a receive, and runs
// Config.Concurrency messages at once; the messages received ahead wait
// their turn invisible to other consumers (their visibility extended). A message is deleted only once its
// outcome is settled: completed, replayed, failed for good, poisoned. While
// the work runs its visibility timeout is extended (ChangeMessageVisibility)
// — by the Guard's heartbeats, which extend the claim's lease, or by a
// timer for the inbox — so no other consumer receives it meanwhile. A
// message whose key another consumer holds, or whose work must run again,
// is made visible again after the policy's delay, never deleted. A message
// without a key, whose key came with another payload, or poisoned goes to
// the dead-letter path: a copy to Config.DeadLetterQueueURL (with the reason
// in the Idem-Reason attribute), then the delete; or, without one, the
// queue's redrive policy, which moves it to its dead-letter queue once it
// was received maxReceiveCount times. Nothing is dropped: a Consumer of a
// queue with neither does not start.
//
// On a FIFO queue the messages of one message group are run one after the
// other, in the order SQS handed them over; a message that is not deleted
// sends the rest of its group in that receive back with it.
//
// The key is the producer's: the Idempotency-Key message attribute by
// default (outbox/sqssender writes it), any broker.KeyFunc — broker.JSONKey
// of the body, broker.HeaderKey of another attribute — or, on a FIFO queue,
// the MessageDeduplicationId (DeduplicationIDKey). SQS's own FIFO
// deduplication forgets a message id after five minutes; the store
// remembers it for the Guard's retention.
package sqsidem
