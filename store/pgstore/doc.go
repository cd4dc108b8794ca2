// Package pgstore is the PostgreSQL store.Store, on pgx v5: a durable store
// shared by any number of processes, and the one to use where the inbox and
// outbox live in the business database.
//
// Every transition is one SQL statement — Acquire is a single
// INSERT … ON CONFLICT DO UPDATE … RETURNING whose CASE expressions decide the
// outcome from the row as it was under the row lock — and every time comes
// from the database clock (now()), so the processes' clocks do not matter.
//
// Calls that wait for the store together share a statement (group commit,
// on by default; Config.NoCoalesce, or idem_coalesce=0 in a store URL, turns
// it off): while an acquire statement is in flight, the Acquires that arrive
// join the next one — the same statement over arrays of keys and
// fingerprints, rows in key order, each key decided exactly as alone — and
// likewise Complete and Fail. A call that finds the store idle runs alone at
// once, so a lone caller's latency does not change. A shared statement is
// atomic: it applies to every call or to none; a value the server refuses in
// one call (a data exception) makes each call run alone, so only that one
// fails.
//
// A retention of a minute or more ends at the next whole second after it
// (a record is kept up to a second longer than asked, never shorter), so a
// settle within the second of its acquire leaves expires_at, the indexed
// column, unchanged and PostgreSQL updates the row in place (a HOT update:
// no second index entry, the old version pruned from its page without
// VACUUM); the table keeps 10% of each page free for that (fillfactor 90).
// Shorter retentions are exact.
//
// The records table keeps keys and fingerprints packed, as bytea
// (internal/keypack: a compact key as its 16 bytes, a request digest as 17
// bytes), its columns ordered so that a row has no padding: a completed
// record with a compact key and a 28-byte result takes 160 bytes of row
// and key index entry.
package pgstore
