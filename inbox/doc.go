// Package inbox is the transactional idempotent consumer: the key of every
// processed message goes into a processed_events table in the same
// transaction as the business change it caused. The key is inserted first
// (ON CONFLICT DO NOTHING); no row inserted means the message was processed
// before: roll back, report Duplicate, acknowledge. The effect is exactly
// once relative to that database, with no lease to manage.
//
// The key is the producer's correlation id — an order number, a payment
// instruction id — never the broker's message id: a broker gives a message a
// new id when it is republished from a dead-letter queue, replayed from an
// archive or re-sent by a producer that timed out, and every one of those is
// the same business intent that must not be booked twice.
//
// It works on any sqldriver.Driver — PostgreSQL through pgx (pgx.Tx) or
// database/sql (*sql.Tx), SQLite through database/sql — and takes the
// driver's own transaction type. The version guard (Event.Entity and
// Event.Version, or ApplyVersionTx) joins the same transaction to reject
// stale updates that arrive late.
package inbox
