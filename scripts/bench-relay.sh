#!/usr/bin/env bash
# Relay throughput from PostgreSQL to NATS JetStream, idem's outbox relay (without
# ordering keys, and with 1,000 of them) vs
# Watermill's SQL forwarder, on the same rows in one run; prints the ratio.
# With IDEM_BENCH_MYSQL_URL (mysql://USER@HOST:PORT/DB, a database it drops and
# makes again), also the relay from MySQL or MariaDB, as a ratio of PostgreSQL's.
# Usage: scripts/bench-relay.sh [ROWS]   (default 50000)
# Needs PostgreSQL and NATS (JetStream) on 127.0.0.1 (IDEM_TEST_POSTGRES_URL, IDEM_TEST_NATS_URL).
set -euo pipefail
cd "$(dirname "$0")/.."
cd scripts # its own module: the benchmark-only dependencies stay out of idem's
go run ./relaybench -n "${1:-50000}" \
	-pg "${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}" \
	-nats "${IDEM_TEST_NATS_URL:-nats://127.0.0.1:4222}" \
	-mysql "${IDEM_BENCH_MYSQL_URL:-}"
