// Package mysqlstore is a store.Store on MySQL (8.0 and later) or MariaDB
// (10.6 and later): one InnoDB table, idem_records, in the database the
// store's URL or DSN names.
//
// Every transition is one round trip. Acquire is one
// INSERT … ON DUPLICATE KEY UPDATE whose CASE expressions decide the
// outcome from the row as it was, sent together with the SELECT that reads
// the record back (MySQL has no RETURNING) inside START TRANSACTION …
// COMMIT, as one multi-statement query: the row stays locked between the
// two, so what is read back is what the claim wrote. Heartbeats, settles
// and releases are one UPDATE each, conditional on the fence. The calls
// that arrive while the store is busy share the next round trip and its
// single commit (Config.NoCoalesce turns that off): its acquisitions of one
// MaxAttempts are one INSERT of many rows and one read-back, its settles
// one UPDATE and one read-back of the keys it settled.
//
// Times are Unix milliseconds from the store's clock, in BIGINT columns;
// keys and fingerprints are packed (internal/keypack) into VARBINARY
// columns. A deleted record keeps its row, expired, until a sweep after
// the millisecond of its Delete, so the key's next fence counts up from
// it; fences also never fall below the server's clock in microseconds.
package mysqlstore
