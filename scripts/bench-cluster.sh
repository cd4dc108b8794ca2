#!/usr/bin/env bash
# Scaling out Redis: idem bench lifecycles/s on one Redis server and on a
# Redis Cluster of 3 masters (no replicas), started here as processes on
# free loopback ports and stopped at the end; same concurrency, one run
# each, printed side by side with the ratio. On a 2-core machine the three
# masters share the cores with the benchmark itself: run it on a bigger
# machine for the figure that matters.
#
# Usage: scripts/bench-cluster.sh [SECONDS] [CONCURRENCY]   (defaults: 10 64)
# Needs redis-server, redis-cli and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conc=${2:-64}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
start() { # port extra-args...
	local port=$1
	shift
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
		--logfile "$tmp/redis-$port.log" "$@" &
	pids+=($!)
	until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
}

go build -o "$tmp/idem" ./cmd/idem
json_field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["'"$1"'"])'; }

single=$(free_port)
start "$single"
masters=()
for _ in 1 2 3; do
	p=$(free_port)
	start "$p" --cluster-enabled yes --cluster-config-file "$tmp/nodes-$p.conf"
	masters+=("127.0.0.1:$p")
done
redis-cli --cluster create "${masters[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
until redis-cli -p "${masters[0]#*:}" cluster info | grep -q cluster_state:ok; do sleep 0.1; done

echo "== $secs s per run, $conc concurrent workers, $(nproc) cores"
one=$("$tmp/idem" bench --store "redis://127.0.0.1:$single?pool_size=$conc" --mode lifecycle \
	--concurrency "$conc" --duration "${secs}s" --quiet --json | json_field ops_per_sec)
seeds=""
for m in "${masters[@]:1}"; do seeds="$seeds&addr=$m"; done
three=$("$tmp/idem" bench --store "redis://${masters[0]}?idem_cluster=1&pool_size=$conc$seeds" --mode lifecycle \
	--concurrency "$conc" --duration "${secs}s" --quiet --json | json_field ops_per_sec)
printf '1 master          %10.0f lifecycles/s\n' "$one"
printf '3-master cluster  %10.0f lifecycles/s\n' "$three"
python3 -c "print('ratio %.2fx' % ($three / $one))"
