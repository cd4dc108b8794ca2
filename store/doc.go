// Package store is the contract between idem's Guard and the backends that
// keep its records: what a store implements, and what an operator reads.
//
//   - [Store]: claim a key ([Store.Acquire], answered with an [Acquisition]
//     whose [Outcome] says whether the caller owns the key now), heartbeat
//     and settle it under the fence it was given, read, delete and sweep —
//     each one atomic operation against the backend (one round trip);
//   - [Record] and its [State]s: in flight under a lease with a fencing token,
//     completed, failed, released, poisoned;
//   - optional abilities a store may have: [Lister], [Scanner],
//     [StateCounter] (for operators), [Archiver], [StoredArchiver],
//     [ArchiveAwaiter], [Unclaimer], [FencedDeleter] (for the tiered store),
//     [Migrator] (a schema);
//   - storage keys: [RawKey] and [CompactKey] (what idem.Key.Storage
//     returns), [SplitKey], [DisplayKey], [ValidateKey];
//   - [Limits] and the sentinel errors every store wraps its own with.
//
// An application does not need this package to use idem: it passes a store
// from store/memstore, store/sqlitestore, store/pgstore, store/redisstore or
// store/tieredstore to idem.NewGuard. store/storetest is the conformance suite
// a new store must pass.
//
// This package imports only the standard library.
package store
