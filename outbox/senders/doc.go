// Package senders delivers outbox messages over HTTP, NATS JetStream and
// AMQP, each with the message's key in the protocol's own dedup field, the
// same bytes on every attempt:
//
//	http:// https://   POST, Idempotency-Key: "<key>" (an sf-string)
//	nats://HOST/SUBJECT  JetStream publish, Nats-Msg-Id: <key>
//	amqp://…?exchange=E&routing_key=R  publish with publisher confirms, message-id = <key>
//	as2+https://HOST/PATH?from=A&to=B  AS2-style POST, Message-ID = <key@host> (no signing or encryption yet)
//
// New returns an outbox.Router with all three.
package senders
