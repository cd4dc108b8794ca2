// Package e2e holds idem's end-to-end fault campaigns: the sender's outbox,
// a real broker and the receiver's transactional inbox, run together in
// processes that are killed and frozen while the database and the broker
// are cut and the broker crashes — the promise "never twice, never lost, never someone else's"
// checked where users see it, on the business rows at both ends. It has
// tests only; see campaign_test.go.
package e2e
