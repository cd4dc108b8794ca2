#!/usr/bin/env bash
# Counts the instructions redis-server executes per idem lifecycle (acquire a
# fresh key, complete it), with a key per record and in buckets, coalesced
# and not: a figure that, unlike lifecycles/s on a shared machine, does not
# move with what else the machine is doing, so two builds of the scripts can
# be compared in minutes (timed runs here differ by up to 40% from one hour
# to the next; see docs/benchmarks.md).
#
# How: a redis-server of its own (on PORT) is filled with records of both
# layouts by `idem bench` for PRELOAD seconds each, saved, and started again
# from that file under valgrind's callgrind, which counts each instruction
# the server executes in user space (not the kernel's work for its sockets:
# a shared round trip saves that too, and callgrind does not see it). Each
# configuration then runs SECONDS under the count, zeroed before and dumped
# after; instructions per lifecycle = the dump's total / the lifecycles idem
# bench reports. The same server and records serve every run, so the records
# a layout holds (and a bucket's length, which its scans walk) are the same
# for each build. Under callgrind the server runs some 30 times slower, so
# per lifecycle it would see far more of what happens per minute: a bucket's
# sweep of its expired fields (once a minute a bucket, under 1% of
# lifecycles at full speed) would come in one lifecycle in eight. So the
# records are saved with every bucket's next sweep an hour away: the runs
# count no sweep, only the look at its time (the table prints the sweeps
# counted, HSCAN, as a check).
#
# Usage: scripts/redis-instructions.sh [SECONDS] [PRELOAD] [PORT]
#        (defaults: 8 20 6398; IDEM_B=path/to/another/idem measures that
#        build too, alternating with this checkout's, on the same records;
#        LAYOUTS="key bkt" and MODES="1 0" — coalesced, not — choose runs;
#        BUCKETS=N the buckets' idem_buckets, 16384 unless set;
#        PHASE=replay counts idem bench's replay phase instead: acquisitions
#        of completed keys, a duplicate's path — its 100 keys' lifecycles,
#        made first, are in the count, under 1% of it;
#        KEEP=dir keeps callgrind's dumps there, for callgrind_annotate: per
#        function with a redis-server built with symbols first in PATH)
# Needs valgrind, redis-server, redis-cli and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
preload=${2:-20}
port=${3:-6398}
phase=${PHASE:-lifecycle}
case $phase in lifecycle | replay) ;; *) echo "PHASE is $phase, want lifecycle or replay" >&2; exit 2 ;; esac
tmp=$(mktemp -d)
cleanup() {
	redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT

go build -o "$tmp/idem" ./cmd/idem
builds=("$tmp/idem")
[ -n "${IDEM_B:-}" ] && builds+=("$IDEM_B")
url="redis://127.0.0.1:$port/0?pool_size=32"
key="&idem_prefix=idemkey:"
bkt="&idem_prefix=idembkt:&idem_buckets=${BUCKETS:-16384}"
bench() { # BUILD URL SECONDS [PHASE]: prints the lifecycles (or replays) run
	"$1" bench --store "$2" --mode "${4:-lifecycle}" --keys 100 --concurrency 32 --duration "${3}s" --retention 2h --quiet --json |
		tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]]["ops"])' "${4:-lifecycle}"
}
wait_up() { for _ in $(seq 1 300); do redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && return; sleep 1; done; exit 1; }

# The records: PRELOAD seconds of lifecycles for each layout, saved.
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --daemonize yes \
	--logfile "$tmp/redis.log" >/dev/null
wait_up
loaded_key=$(bench "$tmp/idem" "$url$key" "$preload")
loaded_bkt=$(bench "$tmp/idem" "$url$bkt" "$preload")
# Each bucket's next sweep (field "", 6 bytes of ms; see bucket.lua) an hour away.
redis-cli -p "$port" EVAL "local t = redis.call('TIME')
local at = struct.pack('>I6', t[1] * 1000 + 3600000)
local cursor, n = '0', 0
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', 'idembkt:*\$*', 'COUNT', 1000)
  cursor = page[1]
  for _, b in ipairs(page[2]) do redis.call('HSET', b, '', at); n = n + 1 end
until cursor == '0'
return n" 0 >/dev/null
redis-cli -p "$port" SAVE >/dev/null
redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
sleep 1
nbkt=$(((${BUCKETS:-16384} + 16383) / 16384 * 16384))
echo "== records: $loaded_key with a key each, $loaded_bkt in $nbkt buckets ($((loaded_bkt / nbkt)) a bucket); $secs s per run, 32 workers"

valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.%p.out" \
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >"$tmp/valgrind.log" 2>&1 &
vg=$!
wait_up
for build in "${builds[@]}"; do # the scripts' first run (SCRIPT LOAD, its SHA1; FUNCTION LOAD) outside the counts
	bench "$build" "$url$key" 1 >/dev/null
	bench "$build" "$url$bkt" 1 >/dev/null
done
hscans() { redis-cli -p "$port" INFO commandstats | tr -d '\r' | sed -nE 's/^cmdstat_hscan:calls=([0-9]+),.*/\1/p' | grep . || echo 0; }
run=0
for layout in ${LAYOUTS:-key bkt}; do
	for coalesce in ${MODES:-1 0}; do
		for build in "${builds[@]}"; do
			params=$key
			[ "$layout" = bkt ] && params=$bkt
			run=$((run + 1))
			h0=$(hscans)
			callgrind_control -z "$vg" >/dev/null 2>&1
			ops=$(bench "$build" "$url$params&idem_coalesce=$coalesce" "$secs" "$phase")
			callgrind_control -d "run$run" "$vg" >/dev/null 2>&1
			h1=$(hscans)
			dump=$(ls -t "$tmp"/cg.*.out.* | head -1)
			total=$(sed -nE 's/^totals: ([0-9]+).*/\1/p' "$dump")
			[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$dump" "$KEEP/$layout-coalesce$coalesce-$run.out" && echo "$ops" >"$KEEP/$layout-coalesce$coalesce-$run.ops"
			name=$([ "$build" = "$tmp/idem" ] && echo "this checkout" || echo "$build")
			python3 -c 'import sys
layout, coalesce, name, ops, total, hs, phase = sys.argv[1:]
ops, total, hs = int(ops), int(total), int(hs)
lay = {"key": "a key per record", "bkt": "buckets"}[layout]
mode = {"1": "coalesced", "0": "not coalesced"}[coalesce]
sweeps = f"  ({hs} sweeps)" if layout == "bkt" else ""
print(f"{lay:17} {mode:13} {total / ops:9,.0f} instructions a {phase} ({ops} {phase}s){sweeps}  {name}")' \
				"$layout" "$coalesce" "$name" "$ops" "$total" "$((h1 - h0))" "$phase"
		done
	done
done
