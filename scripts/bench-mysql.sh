#!/usr/bin/env bash
# Measures, in one run, idem's MySQL/MariaDB store lifecycles (claim and
# complete a fresh key) against the server's own benchmark tool doing a
# bare claim and settle — the same two statements' kind, one round trip and
# one commit each (INSERT … ON DUPLICATE KEY UPDATE, then an UPDATE on the
# fence) — at the same concurrency, and prints the ratios. idem runs with
# coalescing (the default) and without (idem_coalesce=0).
#
# Usage: scripts/bench-mysql.sh [SECONDS] [CONCURRENCY]   (defaults: 10 32)
# Needs mariadb-slap (or mysqlslap), the mariadb (or mysql) client and
# python3; the server of IDEM_MYSQL_URL (default mysql://root@127.0.0.1:3306/test:
# its user, host and port; the script makes the databases idem_bench and
# idem_slap beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conc=${2:-32}
url=${IDEM_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}
read -r user pass host port < <(python3 -c 'import sys, urllib.parse as u
p = u.urlparse(sys.argv[1]); print(p.username or "root", p.password or "-", p.hostname or "127.0.0.1", p.port or 3306)' "$url")
client=$(command -v mariadb || command -v mysql)
slap=$(command -v mariadb-slap || command -v mysqlslap)
auth=(-h "$host" -P "$port" -u "$user")
[ "$pass" != "-" ] && auth+=("-p$pass")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; "$client" "${auth[@]}" -e "DROP DATABASE IF EXISTS idem_bench" >/dev/null 2>&1 || true' EXIT
go build -o "$tmp/idem" ./cmd/idem
"$client" "${auth[@]}" -e "DROP DATABASE IF EXISTS idem_bench; CREATE DATABASE idem_bench"
bench_url="${url%/*}/idem_bench"
bench() { # URL → ops/s and client CPU µs per lifecycle
	"$tmp/idem" bench --store "$1" --mode lifecycle --concurrency "$conc" --duration "${secs}s" --quiet --json | tail -1 |
		python3 -c 'import json, sys; v = json.loads(sys.stdin.read()); print(v["ops_per_sec"], v["client_cpu_us_per_op"])'
}
read -r idem_ops idem_cpu < <(bench "$bench_url")
read -r idem_single_ops idem_single_cpu < <(bench "$bench_url?idem_coalesce=0")
# The bare loop: a fresh key per lifecycle (UUID()), idem's own table.
ddl=$("$tmp/idem" migrate --print --store "$bench_url" | python3 -c 'import re, sys
s = sys.stdin.read(); m = re.search(r"CREATE TABLE IF NOT EXISTS idem_records \(.*?\) ENGINE=[^;]*", s, re.S); print(re.sub(r"--[^\n]*", "", m.group(0)).replace("\n", " "))')
lifecycles=$((conc * 200))
"$slap" "${auth[@]}" --create-schema=idem_slap --create="$ddl" --delimiter=";" --concurrency="$conc" \
	--number-of-queries=$((lifecycles * 3)) --iterations=1 --query="SET @k = UUID();
INSERT INTO idem_records (k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at, outcome)
VALUES (@k, 1, 1796606160088000, 'fp', 1, NULL, 1796606220088, 1796609760088, 1796606160088, 1) ON DUPLICATE KEY UPDATE outcome = 3;
UPDATE idem_records SET state = 2, result = '{\"ok\":true}', lease_until = 0, expires_at = 1796609760088
WHERE k = @k AND fence = 1796606160088000 AND state = 1" >"$tmp/slap.out"
slap_secs=$(sed -nE 's/.*Average number of seconds to run all queries: ([0-9.]+) seconds.*/\1/p' "$tmp/slap.out")
python3 - "$idem_ops" "$idem_cpu" "$idem_single_ops" "$idem_single_cpu" "$lifecycles" "$slap_secs" "$conc" "$(nproc)" <<'PY'
import sys
idem, cpu, single, single_cpu, n, secs, conc, ncpu = sys.argv[1:]
bare = float(n) / float(secs)
print(f"== {conc} concurrent, {ncpu} cores")
print(f"idem bench lifecycles {float(idem):.0f}/s (client CPU {float(cpu):.0f} µs each), uncoalesced {float(single):.0f}/s ({float(single_cpu):.0f} µs)")
print(f"mariadb-slap, the bare claim and settle: {bare:.0f}/s")
print(f"ratio {float(idem) / bare:.2f} coalesced (target ≥ 1.5), {float(single) / bare:.2f} not")
PY
