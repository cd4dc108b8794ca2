#!/usr/bin/env bash
# Measures, in one run with wrk: a bare httputil.ReverseProxy in front of a
# trivial upstream, and idem serve in front of the same upstream on the
# execute path (a fresh Idempotency-Key per request) and the replay path
# (100 keys, repeated), with the memory and the Redis store (Redis with and
# without coalescing); prints the ratios and each server process's CPU time
# per request (/proc, around each run). Every request carries the same
# Authorization header: without a principal idem serve would forward it
# unprotected (its default --principal), and measure nothing of its own.
#
# Usage: scripts/bench-http.sh [SECONDS] [CONNECTIONS]   (defaults: 10 64)
# Needs wrk (Debian package wrk) and Redis on 127.0.0.1:6379 (IDEM_TEST_REDIS_URL).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-64}
redis_url=${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

go build -o "$tmp/idem" ./cmd/idem
(cd scripts && go build -o "$tmp/httpbench" ./httpbench)

cat >"$tmp/fresh.lua" <<'LUA'
local threads = 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
function init(args) n = 0; prefix = tostring(tid) .. "-" .. tostring(os.time()) .. "-" end
function request()
  n = n + 1
  return wrk.format("POST", "/payments", {["Idempotency-Key"] = '"' .. prefix .. n .. '"', ["Authorization"] = "Bearer bench"}, "amount=2500")
end
LUA
cat >"$tmp/replay.lua" <<'LUA'
local threads = 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
function init(args) n = 0 end
function request()
  n = n + 1
  return wrk.format("POST", "/payments", {["Idempotency-Key"] = '"replay-' .. (n % 100) .. '"', ["Authorization"] = "Bearer bench"}, "amount=2500")
end
LUA
cat >"$tmp/bare.lua" <<'LUA'
function request() return wrk.format("POST", "/payments", {["Authorization"] = "Bearer bench"}, "amount=2500") end
LUA

start() { "$@" >"$tmp/log.$$" 2>&1 & pids+=($!); }
wait_port() { for _ in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
# measure SCRIPT URL PID → requests/s, and the CPU time (user and system)
# the server process PID spent per request, in µs, read from /proc around
# the run.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
measure() {
	local t0 t1 out
	t0=$(ticks "$3")
	out=$(wrk -t2 -c"$conns" -d"${secs}s" -s "$1" "$2")
	t1=$(ticks "$3")
	awk -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" '/requests in/ {n = $1} /Requests\/sec/ {r = $2} END {printf "%s %.1f\n", r, t * 1e6 / hz / n}' <<<"$out"
}

start "$tmp/httpbench" upstream 127.0.0.1:18081; wait_port 18081
start "$tmp/httpbench" proxy 127.0.0.1:18082 http://127.0.0.1:18081; wait_port 18082
start "$tmp/idem" serve --listen 127.0.0.1:18083 --upstream http://127.0.0.1:18081 --store memory:; wait_port 18083
redis-cli -u "$redis_url" --scan --pattern 'idemhttp:*' | xargs -r -n 500 redis-cli -u "$redis_url" DEL >/dev/null
start "$tmp/idem" serve --listen 127.0.0.1:18084 --upstream http://127.0.0.1:18081 --store "$redis_url?pool_size=$conns&idem_prefix=idemhttp:"; wait_port 18084
start "$tmp/idem" serve --listen 127.0.0.1:18085 --upstream http://127.0.0.1:18081 --store "$redis_url?pool_size=$conns&idem_prefix=idemhttp:&idem_coalesce=0"; wait_port 18085

# The requests must be idem's to measure: a second send of a key is replayed.
for port in 18083 18084 18085; do
	for _ in 1 2; do
		replayed=$(curl -s -o /dev/null -D - -X POST -H 'Idempotency-Key: "bench-check"' -H 'Authorization: Bearer bench' \
			--data amount=2500 "http://127.0.0.1:$port/payments" | tr -d '\r' | awk 'tolower($1) == "idempotent-replayed:" {print $2}')
	done
	if [[ $replayed != true ]]; then
		echo "idem serve on port $port did not replay a repeated key: the benchmark would measure a plain proxy" >&2
		exit 1
	fi
done

echo "== wrk -t2 -c$conns -d${secs}s, $(nproc) cores (wrk, proxies and upstream share them)"
# The servers' pids, in the order started: upstream, proxy, memory, Redis, Redis uncoalesced.
read -r bare bare_cpu < <(measure "$tmp/bare.lua" http://127.0.0.1:18082 "${pids[1]}")
read -r mem_exec mem_exec_cpu < <(measure "$tmp/fresh.lua" http://127.0.0.1:18083 "${pids[2]}")
read -r mem_replay mem_replay_cpu < <(measure "$tmp/replay.lua" http://127.0.0.1:18083 "${pids[2]}")
read -r redis_exec redis_exec_cpu < <(measure "$tmp/fresh.lua" http://127.0.0.1:18084 "${pids[3]}")
read -r redis_replay redis_replay_cpu < <(measure "$tmp/replay.lua" http://127.0.0.1:18084 "${pids[3]}")
read -r redis_exec_single redis_exec_single_cpu < <(measure "$tmp/fresh.lua" http://127.0.0.1:18085 "${pids[4]}")
redis-cli -u "$redis_url" --scan --pattern 'idemhttp:*' | xargs -r -n 500 redis-cli -u "$redis_url" DEL >/dev/null

python3 - "$bare" "$mem_exec" "$mem_replay" "$redis_exec" "$redis_replay" "$redis_exec_single" \
	"$bare_cpu" "$mem_exec_cpu" "$mem_replay_cpu" "$redis_exec_cpu" "$redis_replay_cpu" "$redis_exec_single_cpu" <<'PY'
import sys
bare, me, mr, re_, rr, res = map(float, sys.argv[1:7])
bc, mec, mrc, rec, rrc, resc = map(float, sys.argv[7:13])
def cpu(c):
    return f"CPU {c:5.1f} µs/req ({c - bc:+.1f} over bare)"
print(f"bare httputil.ReverseProxy          {bare:9.0f} req/s              CPU {bc:5.1f} µs/req")
print(f"idem serve memory:, execute path    {me:9.0f} req/s  {me/bare:.2f}x bare  {cpu(mec)} (target ≥ 0.60x)")
print(f"idem serve memory:, replay path     {mr:9.0f} req/s  {mr/bare:.2f}x bare  {cpu(mrc)} (target ≥ 1.00x)")
print(f"idem serve redis://, execute path   {re_:9.0f} req/s  {re_/bare:.2f}x bare  {cpu(rec)} (coalesced)")
print(f"  the same, idem_coalesce=0         {res:9.0f} req/s  {res/bare:.2f}x bare  {cpu(resc)} (coalescing: {re_/res:.2f}x)")
print(f"idem serve redis://, replay path    {rr:9.0f} req/s  {rr/bare:.2f}x bare  {cpu(rrc)}")
PY
