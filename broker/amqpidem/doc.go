// Package amqpidem makes RabbitMQ (AMQP 0-9-1, amqp091-go) consumers
// idempotent: each delivery runs through an idem.Guard (store-based) or the
// transactional inbox, and the broker is told what happened:
//
//	duplicate of a done message   → Ack
//	in progress / transient       → Nack with requeue, after the policy's delay
//	poisoned, or key reused       → Reject without requeue: the queue's
//	                                dead-letter exchange (x-dead-letter-exchange) gets it
//
// Use manual acknowledgements (autoAck false) and a prefetch (Qos).
package amqpidem
