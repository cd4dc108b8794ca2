#!/usr/bin/env bash
# Measures, in one run, idem's store transitions against each server next to
# the server's own benchmark tool doing the same round trips at the same
# concurrency, and prints the ratios.
#
#   Redis:      idem bench --mode lifecycle   vs  redis-benchmark FCALL of the same two functions,
#               and idem with records in buckets (idem_buckets) vs a key per record
#               (as Redis functions both, and vs a key per record sent as scripts)
#   PostgreSQL: idem bench --mode lifecycle   vs  pgbench -f of the same two statements
#
# idem runs with coalescing (the default: calls that wait share a round trip)
# and without (idem_coalesce=0), at CONCURRENCY workers and at 1 (p50
# latency: a lone caller must not pay for coalescing).
#
# Usage: scripts/bench-stores.sh [SECONDS] [CONCURRENCY]   (defaults: 10 32)
# Needs redis-benchmark, redis-cli, pgbench, psql and python3; the servers on
# 127.0.0.1 (IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL to override).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conc=${2:-32}
redis_url=${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}
pg_url=${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

go build -o "$tmp/idem" ./cmd/idem
(cd scripts && go run ./benchscripts pgbench idem_bench) >"$tmp/lifecycle.sql"
(cd scripts && go run ./benchscripts redis-library) >"$tmp/library.lua"
acq_fn=$(cd scripts && go run ./benchscripts redis-function acquire)
own_fn=$(cd scripts && go run ./benchscripts redis-function settle)
ncpu=$(nproc)
echo "== $secs s per run, $conc concurrent workers, $ncpu cores"

rps() { tr '\r' '\n' | sed -nE 's/.*: ([0-9.]+) requests per second.*/\1/p' | tail -1; }
json_field() { # PATH (dotted: lifecycle.ops) of the JSON on stdin's last line
	python3 -c 'import json,sys
v = json.loads(sys.stdin.read().strip().splitlines()[-1])
for k in sys.argv[1].split("."): v = v.get(k, 0)
print(v)' "$1"
}

# --- Redis -----------------------------------------------------------------
# Each Redis run starts on an empty key space: the runs before would
# otherwise leave hundreds of thousands of records behind for the later
# ones to work among (a larger table, its resizing).
redis_clean() { redis-cli -u "$redis_url" --scan --pattern 'idembench:*' | xargs -r -n 500 redis-cli -u "$redis_url" DEL >/dev/null; }
bench() { # URL WORKERS FIELD (the whole JSON stays in $tmp/run.json)
	case "$1" in redis*) redis_clean ;; esac
	"$tmp/idem" bench --store "$1" --mode lifecycle --concurrency "$2" --duration "${secs}s" --quiet --json >"$tmp/run.json"
	json_field "$3" <"$tmp/run.json"
}
# CPU time per lifecycle, where the two transports differ: this idem
# process's (client_cpu_us_per_op) and redis-server's (INFO cpu, before and
# after the run, over its lifecycles). Prints "ops/s client-µs server-µs".
redis_cpu() { redis-cli -u "$redis_url" INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
bench_cpu() { # URL WORKERS
	redis_clean
	local before ops after
	before=$(redis_cpu)
	ops=$(bench "$1" "$2" ops_per_sec)
	after=$(redis_cpu)
	echo "$ops $(json_field client_cpu_us_per_op <"$tmp/run.json")" \
		"$(python3 -c 'import sys; print((float(sys.argv[2]) - float(sys.argv[1])) * 1e6 / float(sys.argv[3]))' "$before" "$after" "$(json_field lifecycle.ops <"$tmp/run.json")")"
}
read -r idem_redis redis_client_us redis_server_us < <(bench_cpu "$redis_url?pool_size=$conc&idem_prefix=idembench:" "$conc")
read -r idem_redis_single redis_client_us_single redis_server_us_single < <(bench_cpu "$redis_url?pool_size=$conc&idem_prefix=idembench:&idem_coalesce=0" "$conc")
# Records in buckets (idem_buckets: many records per hash) against a key per
# record, in three pairs of runs back to back, alternating which goes first
# (the machine's speed drifts between runs further apart): prints the six
# rates, buckets first in each pair.
pairs() { # URL-BUCKETS URL-KEYS
	local i a b
	for i in 1 2 3; do
		if ((i % 2)); then
			a=$(bench "$1" "$conc" ops_per_sec)
			b=$(bench "$2" "$conc" ops_per_sec)
		else
			b=$(bench "$2" "$conc" ops_per_sec)
			a=$(bench "$1" "$conc" ops_per_sec)
		fi
		printf '%s %s ' "$a" "$b"
	done
}
# The bucket layout that keeps a completed record within 100 bytes at
# 1,000,000 records (~31 records a bucket; docs/store-redis.md).
buckets="idem_buckets=32768"
buckets_pairs=$(pairs "$redis_url?pool_size=$conc&idem_prefix=idembench:&$buckets" "$redis_url?pool_size=$conc&idem_prefix=idembench:")
buckets_pairs_single=$(pairs "$redis_url?pool_size=$conc&idem_prefix=idembench:&$buckets&idem_coalesce=0" "$redis_url?pool_size=$conc&idem_prefix=idembench:&idem_coalesce=0")
# And against a key per record sent as scripts (EVALSHA: idem_functions=0), coalesced.
buckets_pairs_scripts=$(pairs "$redis_url?pool_size=$conc&idem_prefix=idembench:&$buckets" "$redis_url?pool_size=$conc&idem_prefix=idembench:&idem_functions=0")
redis_p50=$(bench "$redis_url?idem_prefix=idembench:" 1 p50_us)
redis_p50_single=$(bench "$redis_url?idem_prefix=idembench:&idem_coalesce=0" 1 p50_us)
redis_clean
# idem calls its transitions as Redis functions (redisstore.Config.NoFunctions):
# the same library, loaded here (idem's runs above loaded it already).
redis-cli -u "$redis_url" -x FUNCTION LOAD REPLACE <"$tmp/library.lua" >/dev/null
n=$((secs * 30000))
# Acquire of fresh keys (a keyspace far larger than the requests), then
# complete with fence 1 over a keyspace the acquire run filled.
rb_acq=$(redis-benchmark -u "$redis_url" -c "$conc" -n "$n" -r "$n" -q \
	FCALL "$acq_fn" 1 "idembench:{rb:__rand_int__}" bench 60000 3600000 0 n__rand_int__ | rps)
rb_cmp=$(redis-benchmark -u "$redis_url" -c "$conc" -n "$n" -r "$n" -q \
	FCALL "$own_fn" 1 "idembench:{rb:__rand_int__}" c 1 3600000 '{"status":"ok"}' n__rand_int__ | rps)
redis_clean
# The same, pipelined 16 deep: the server's ceiling for these functions when
# the network costs nothing (the complete runs with a stale fence, the
# cheaper path, so the ceiling is if anything too high).
rb_acq_p=$(redis-benchmark -u "$redis_url" -c "$conc" -n "$((n * 2))" -r "$n" -P 16 -q \
	FCALL "$acq_fn" 1 "idembench:{rbp:__rand_int__}" bench 60000 3600000 0 n__rand_int__ | rps)
rb_cmp_p=$(redis-benchmark -u "$redis_url" -c "$conc" -n "$((n * 2))" -r "$n" -P 16 -q \
	FCALL "$own_fn" 1 "idembench:{rbp:__rand_int__}" c 1 3600000 '{"status":"ok"}' n__rand_int__ | rps)
redis_clean

# --- PostgreSQL --------------------------------------------------------------
"$tmp/idem" migrate --store "$pg_url&idem_schema=idem_bench" >/dev/null
# A table in use, analyzed: a statement prepared on an empty table may keep
# a plan that scans it whole (for idem and pgbench alike) until the next
# ANALYZE. No TRUNCATE between the runs, for the same reason.
pg_fill() { # SCHEMA KEY-EXPRESSION (of i)
	psql "$pg_url" -qc "TRUNCATE $1.idem_records;
	INSERT INTO $1.idem_records (k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at, outcome)
	SELECT $2, 2, i, '', 1, '\\x00', now(), now() + interval '1 hour', now(), 1
	FROM generate_series(1, 100000) i; ANALYZE $1.idem_records"
}
pg_fill idem_bench "'\\x00'::bytea || convert_to('fill-' || i, 'UTF8')"
idem_pg=$(bench "$pg_url&pool_max_conns=$conc&idem_schema=idem_bench" "$conc" ops_per_sec)
idem_pg_single=$(bench "$pg_url&pool_max_conns=$conc&idem_schema=idem_bench&idem_coalesce=0" "$conc" ops_per_sec)
pg_p50=$(bench "$pg_url&idem_schema=idem_bench" 1 p50_us)
pg_p50_single=$(bench "$pg_url&idem_schema=idem_bench&idem_coalesce=0" 1 p50_us)
pgb=$(pgbench "$pg_url" -n -M prepared -c "$conc" -j "$ncpu" -T "$secs" -f "$tmp/lifecycle.sql" 2>&1 |
	awk '/^tps = / {print $3; exit}')
psql "$pg_url" -qc 'SET client_min_messages = warning; DROP SCHEMA idem_bench CASCADE'

python3 - "$idem_redis" "$idem_redis_single" "$rb_acq" "$rb_cmp" "$idem_pg" "$idem_pg_single" "$pgb" \
	"$redis_p50" "$redis_p50_single" "$pg_p50" "$pg_p50_single" "$rb_acq_p" "$rb_cmp_p" \
	"$buckets_pairs" "$buckets_pairs_single" \
	"$redis_client_us" "$redis_server_us" "$redis_client_us_single" "$redis_server_us_single" "$ncpu" \
	"$buckets" "$buckets_pairs_scripts" <<'PY'
import statistics, sys
args = sys.argv[1:]
pairs = [list(map(float, a.split())) for a in args[13:15]]
(idem_redis, idem_redis_single, rb_acq, rb_cmp, idem_pg, idem_pg_single, pgb,
 rp50, rp50s, pp50, pp50s, rb_acq_p, rb_cmp_p,
 rc_us, rs_us, rc_us1, rs_us1, ncpu) = map(float, args[:13] + args[15:20])
bucket_layout = args[20]
pairs_scripts = list(map(float, args[21].split()))
def buckets(rates):  # buckets, keys, buckets, keys, ...: "B/s vs K/s: ratios (median)"
    ratios = [rates[i] / rates[i + 1] for i in range(0, len(rates), 2)]
    return (f"{statistics.mean(rates[0::2]):.0f}/s vs {statistics.mean(rates[1::2]):.0f}/s, pairs "
            + " / ".join(f"{r:.2f}" for r in ratios) + f" (median {statistics.median(ratios):.2f})")
rb_life_p = 1 / (1 / rb_acq_p + 1 / rb_cmp_p)
rb_life = 1 / (1 / rb_acq + 1 / rb_cmp)   # one acquire and one complete per lifecycle
print(f"Redis      idem bench lifecycle {idem_redis:8.0f}/s coalesced, {idem_redis_single:8.0f}/s not ({idem_redis / idem_redis_single:.2f}x, target ≥ 2)"
      f" | redis-benchmark acquire {rb_acq:.0f}/s, complete {rb_cmp:.0f}/s → lifecycle {rb_life:.0f}/s"
      f" | ratio {idem_redis / rb_life:.2f} coalesced, {idem_redis_single / rb_life:.2f} not")
print(f"Redis      redis-benchmark -P 16 (the server's ceiling for the scripts): acquire {rb_acq_p:.0f}/s, complete {rb_cmp_p:.0f}/s"
      f" → lifecycle {rb_life_p:.0f}/s | idem coalesced reaches {idem_redis / rb_life_p:.2f} of it; 2x idem uncoalesced would be {2 * idem_redis_single / rb_life_p:.2f} of it")
print(f"Redis      CPU per lifecycle: coalesced {rc_us:.1f} µs idem + {rs_us:.1f} µs redis-server = {rc_us + rs_us:.1f},"
      f" not {rc_us1:.1f} + {rs_us1:.1f} = {rc_us1 + rs_us1:.1f} ({(rc_us1 + rs_us1) / (rc_us + rs_us):.2f}x);"
      f" {ncpu:.0f} cores used whole would allow {ncpu * 1e6 / (rc_us + rs_us):.0f} / {ncpu * 1e6 / (rc_us1 + rs_us1):.0f} lifecycles/s")
print(f"Redis      records in buckets ({bucket_layout}) against a key per record, three pairs back to back (target ≥ 0.90):"
      f" coalesced {buckets(pairs[0])}; not {buckets(pairs[1])};"
      f" against a key per record sent as scripts (idem_functions=0), coalesced {buckets(pairs_scripts)}")
print(f"PostgreSQL idem bench lifecycle {idem_pg:8.0f}/s coalesced, {idem_pg_single:8.0f}/s not ({idem_pg / idem_pg_single:.2f}x)"
      f" | pgbench same two statements {pgb:.0f}/s | ratio {idem_pg / pgb:.2f} coalesced (target ≥ 2), {idem_pg_single / pgb:.2f} not")
print(f"1 worker, p50 of a lifecycle: Redis {rp50:.0f} µs coalesced, {rp50s:.0f} µs not ({rp50 / rp50s:.2f}x, target ≤ 1.10);"
      f" PostgreSQL {pp50:.0f} µs coalesced, {pp50s:.0f} µs not ({pp50 / pp50s:.2f}x)")
PY
