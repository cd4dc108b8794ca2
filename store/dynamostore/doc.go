// Package dynamostore is the Amazon DynamoDB store.Store, on
// aws-sdk-go-v2: for teams on AWS whose functions and services share no
// server of their own — where Powertools for AWS Lambda keeps its
// idempotency records.
//
// One item per record, the storage key its partition key (attribute k). A
// claim of a key that is not there is one conditional PutItem; any other
// transition reads the item (a strongly consistent GetItem, or the item
// DynamoDB returns with a failed condition) and writes it back on the
// condition that its version (attribute v) is still the one read, trying
// again when another writer came first. Heartbeats and settles are one
// conditional UpdateItem each, on the fence.
//
// Fences follow the store contract: a new generation of a key starts at
// the larger of the process's fence sequence and the clock in
// microseconds (this process's clock: DynamoDB has none to read), so they
// keep growing after a delete, a sweep or an expiry as long as the clocks
// of the processes sharing the table do not step back past it.
//
// Retention: every read treats a record past its expiry (attribute ex,
// Unix milliseconds) as absent, whenever DynamoDB's TTL deletes it (its
// ttl attribute, Unix seconds; TTL deletes lazily, up to days late).
// Migrate creates the table (on-demand capacity) and enables TTL.
//
// Throttling, timeouts and unreachable endpoints are store.ErrUnavailable:
// nothing runs without a claim. An item is at most 400 KB: Limits'
// MaxResultBytes defaults to 350 KB, and a larger result is refused
// (store.ErrResultTooLarge), never stored cut.
package dynamostore
