// Package storeurl parses store URLs and opens the store they name. It is
// shared by the idem command and by programs that take a store URL from their
// configuration.
//
//	memory:                          in process, gone at exit
//	sqlite:PATH[?synchronous=FULL]   embedded file (the default: sqlite:idem.db)
//	postgres://… , postgresql://…    PostgreSQL (pgx connection string)
//	redis://… , rediss://…           Redis (go-redis URL)
//
// Every store with a round trip takes idem_coalesce=0 to send each call
// alone; by default the calls that wait for the store together share one
// (a statement, a pipeline, a transaction).
package storeurl
