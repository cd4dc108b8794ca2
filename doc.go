// Package idem makes retries harmless: a duplicate delivery of the same
// business intent causes no second side effect, and the first result is
// replayed to every duplicate.
//
// The package holds the domain and nothing else — it imports only the
// standard library:
//
//   - [Key]: a producer-supplied business id within a scope (consumer, route,
//     tenant), with an optional compact storage form (SHA-256/128, versioned);
//   - [Record] and its states: in flight under a lease with a fencing token,
//     completed, failed, released, poisoned;
//   - [Store]: the contract every backend implements, each transition one
//     atomic operation (one round trip) — proved by the conformance suite in
//     store/storetest;
//   - [Guard] and [Do]: the four phases (extract the key, interrogate the
//     store, take a lease, settle the record) around a function, with a
//     per-outcome failure policy, heartbeats, an in-process cache of completed
//     records and an observer hook.
//
// A duplicate is an [Outcome], never an error. Errors are for misuse and
// failures; every sentinel error starts with "idem: ".
//
// Backends live in their own packages (store/memstore, store/sqlitestore, …);
// this package never imports them.
package idem
