// Package broker holds what the consumer adapters (natsidem, amqpidem,
// kafkaidem, sqsidem, watermillidem; lambdaidem for Lambda functions) share: key extraction from a message, and the mapping of an
// idempotent outcome to what the broker must be told (ack, retry later, dead
// letter). Adapters for other brokers can use it too.
package broker
