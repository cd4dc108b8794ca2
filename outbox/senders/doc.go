// Package senders puts every transport's outbox sender behind one
// outbox.Router, each with the message's key in the protocol's own dedup
// field and the same bytes on every attempt:
//
//	http:// https://   POST, Idempotency-Key: "<key>" (an sf-string)          package httpsender
//	nats://HOST/SUBJECT  JetStream publish, Nats-Msg-Id: <key>                package natssender
//	amqp://…?exchange=E&routing_key=R  publish with publisher confirms, message-id = <key>   package amqpsender
//	sqs://QUEUE-NAME     SendMessage, attribute Idempotency-Key: <key>; FIFO: MessageDeduplicationId   package sqssender
//	as2+https://HOST/PATH?from=A&to=B  AS2-style POST, Message-ID = <key@host>   package as2sender
//
// It links every transport's client; import a transport's package alone to
// link only that one.
package senders
