// Package pgstore is the PostgreSQL idem.Store, on pgx v5: a durable store
// shared by any number of processes, and the one to use where the inbox and
// outbox live in the business database.
//
// Every transition is one SQL statement — Acquire is a single
// INSERT … ON CONFLICT DO UPDATE … RETURNING whose CASE expressions decide the
// outcome from the row as it was under the row lock — and every time comes
// from the database clock (now()), so the processes' clocks do not matter.
package pgstore
