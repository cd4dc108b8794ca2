// Package sqlitestore is the embedded default store.Store: a SQLite file
// (pure Go, modernc.org/sqlite, no cgo) in WAL mode, safe for several
// goroutines and several processes on the same file.
//
// Every transition is one SQL statement: Acquire is a single
// INSERT … ON CONFLICT DO UPDATE … RETURNING whose CASE expressions decide the
// outcome from the row as it was, so there is no read-then-write race even
// between processes. Times are Unix milliseconds from the store's clock.
//
// The records table is STRICT and keeps keys and fingerprints packed, as
// BLOBs (internal/keypack: a compact key as its 16 bytes, a request digest
// as 17): 140 bytes a completed record with a compact key.
package sqlitestore
