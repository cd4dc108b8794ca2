// Package memstore is an in-process store.Store: a sharded map with TTL
// sweeping. It is for tests and single-process services; its records die with
// the process.
package memstore
