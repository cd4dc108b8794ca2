// Package sqlitestore is the embedded default idem.Store: a SQLite file
// (pure Go, modernc.org/sqlite, no cgo) in WAL mode, safe for several
// goroutines and several processes on the same file.
//
// Every transition is one SQL statement: Acquire is a single
// INSERT … ON CONFLICT DO UPDATE … RETURNING whose CASE expressions decide the
// outcome from the row as it was, so there is no read-then-write race even
// between processes. Times are Unix milliseconds from the store's clock.
//
// A records table created by this release is STRICT and keeps keys and
// fingerprints packed, as BLOBs (internal/keypack: a compact key as its 16
// bytes, a request digest as 17): 140 bytes a completed record with a
// compact key against 173 in the TEXT layout of tables created by earlier
// releases, which keep it — the store reads the layout at Open and works
// on either. STRICT makes a process of an earlier release, which writes
// keys as TEXT, fail closed on such a table instead of writing rows this
// release would not find.
package sqlitestore
