// Package idem makes retries harmless: a duplicate delivery of the same
// business intent causes no second side effect, and the first result is
// replayed to every duplicate.
//
// What a user calls:
//
//   - [Key]: the producer's business id within a scope (consumer, route,
//     tenant) — an order number, a payment instruction id, an
//     Idempotency-Key header; never a broker's message id;
//   - [NewGuard] with a [Config] (a store, a lease, a retention) and [Do] (or
//     [Guard.Run]): claim the key in the store under a lease, run the work,
//     settle the record — the result is replayed to every duplicate;
//   - [Permanent], [Ambiguous] and [WithDisposition]: what a failure of the
//     work leaves in the store (a stored failure, a held claim, a release
//     for a re-run);
//   - [FenceFrom]: the fencing token the work runs under, to pass to the
//     systems it writes to;
//   - [ErrInProgress], [ErrFingerprintMismatch], [ErrPoisoned],
//     [ErrStoreUnavailable]: the answers that are not a result. A duplicate is
//     not an error: [Result] says whether the work ran or was replayed.
//
// Stores live in their own packages: store/memstore, store/sqlitestore,
// store/pgstore, store/redisstore, store/tieredstore, and store/storeurl opens
// one from a URL. Package store is the contract they implement (for people
// who write a store, or read a record directly); store/storetest proves it.
// This package links no backend.
package idem
