// Command payments-consumer books credit transfers from a broker into
// PostgreSQL exactly once: each instruction's correlation id is recorded in
// the inbox in the same transaction as the transfer row and the balance
// update, so a redelivery — after a crash between the commit and the ack, or
// a duplicate sent with a new broker message id — books nothing.
//
//	payments-consumer --broker nats://127.0.0.1:4222 --db postgres://postgres@127.0.0.1:5432/test
//	payments-consumer --broker amqp://guest:guest@127.0.0.1:5672/ --db postgres://…
package main
