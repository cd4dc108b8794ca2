// Package outboxtest is the conformance suite of the outbox storage: every
// database the outbox supports runs it.
package outboxtest
