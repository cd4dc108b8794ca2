// Command idem is the idem toolkit's command line, one binary on any store
// URL (embedded SQLite by default):
//
//	idem demo                              the failure sequences, checked
//	idem serve --upstream URL              the Idempotency-Key gateway
//	idem relay / idem outbox enqueue|ls|retry   the transactional outbox
//	idem edi inspect FILE…                 EDI envelopes, dedup keys, problems
//	idem keys get|ls|rm|purge              records
//	idem migrate, idem bench               schema and measurements
package main
