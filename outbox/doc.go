// Package outbox is the sender side of idem: a transactional outbox. The
// application records the intent to send — with its idempotency key — in the
// same transaction as its business data (EnqueueTx); a relay sends it later,
// with the same key on every attempt, written into the protocol's own dedup
// field, and records the outcome. One business intent = one key, generated and
// persisted before the first send.
//
// The table, documented in Schema, can be written by any language:
//
//	INSERT INTO idem_outbox (key, destination, payload) VALUES ('ORD-20260514-0001', 'https://partner/orders', '…');
//
// Rows move pending → sent → acked (or pending → dead after MaxTries), with
// tries, last_error and next_attempt_at (exponential backoff, full jitter).
package outbox
