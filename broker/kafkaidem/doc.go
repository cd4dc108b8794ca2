// Package kafkaidem makes Kafka consumer groups idempotent, on franz-go: each
// record runs through an idem.Guard (store-based) or the transactional inbox,
// and its offset is committed only once its outcome is settled.
//
//	completed, or a duplicate replayed  → committed
//	in progress elsewhere               → retried in place after Policy.InProgressDelay
//	transient failure (released)        → retried in place with exponential backoff
//	poisoned, key reused, no key        → produced to the dead-letter topic, then committed
//
// The key is the producer's: the Idempotency-Key header by default (what
// outbox/kafkasender writes on every attempt), or any broker.KeyFunc. Keying
// by topic, partition and offset (OffsetKey) only deduplicates redeliveries
// of one record: a producer's retry is a new record at a new offset.
//
// Records of one partition are processed in order, one at a time; Concurrency
// records of different partitions run at once. A record retried in place
// holds up its own partition only. A committed offset never passes a record
// whose outcome is not settled, so a crash or a rebalance redelivers from the
// first unsettled record, and the store replays what was already done.
//
// On a rebalance, a consumer stops taking records of the partitions it
// loses, waits up to Config.RevokeTimeout for the record in flight on each,
// commits what settled and lets the partitions go. A record still running
// after that keeps its claim: the partition's new owner meets the key in
// progress, waits, and gets the replay once the old owner settles it.
package kafkaidem
