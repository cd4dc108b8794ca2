#!/usr/bin/env bash
# Receiving at broker speed, in one run: bare JetStream consumption next to
# natsidem over a Guard (memory store, Redis), the payments transaction on
# PostgreSQL without the inbox, with the per-message inbox and with the
# batched inbox, bare RabbitMQ next to amqpidem, and a bare franz-go group
# consumer next to kafkaidem (memory store, Redis); prints the ratios.
# Usage: scripts/bench-consume.sh [MESSAGES]   (default 20000)
# Needs NATS (JetStream), Redis, PostgreSQL and RabbitMQ on 127.0.0.1
# (IDEM_TEST_NATS_URL, IDEM_TEST_REDIS_URL, IDEM_TEST_POSTGRES_URL, IDEM_TEST_AMQP_URL);
# Kafka is a kfake cluster in the benchmark's process unless IDEM_KAFKA_BROKERS names one.
set -euo pipefail
cd "$(dirname "$0")"
go run ./consumebench -n "${1:-20000}" \
	-nats "${IDEM_TEST_NATS_URL:-nats://127.0.0.1:4222}" \
	-redis "${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}" \
	-postgres "${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}" \
	-amqp "${IDEM_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}" \
	-kafka "${IDEM_KAFKA_BROKERS:-}"
