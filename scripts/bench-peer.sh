#!/usr/bin/env bash
# Measures idem side by side with github.com/faustbrian/go-idempotency (the
# peer) in alternating rounds — memory, typed replays (idem.Do), Redis and the
# HTTP middleware — and prints the ratios (scripts/peerbench).
#
# Usage: scripts/bench-peer.sh [PEER_CHECKOUT] [peerbench flags...]
#   PEER_CHECKOUT  a checkout of the peer's repository; without it, the
#                  script clones $IDEM_PEER_REPO (default its GitHub
#                  repository) at the commit peerbench's go.mod names.
# Needs Redis on 127.0.0.1:6379 for the redis section (-redis ADDR, or
# -sections memory,do,http without it).
#
# The peer is built from source: the module proxy this was written against
# does not serve it, so scripts/peerbench's go.sum cannot hold it. A
# workspace (go.work, written to a temporary directory) points the peer's
# module path at the checkout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

commit=$(sed -n 's|.*github.com/faustbrian/go-idempotency v0.0.0-[0-9]*-\([0-9a-f]*\).*|\1|p' "$root/scripts/peerbench/go.mod")
peer=
if [[ $# -gt 0 && $1 != -* ]]; then
	peer=$(cd "$1" && pwd)
	shift
else
	peer=$tmp/peer
	git clone --quiet "${IDEM_PEER_REPO:-https://github.com/faustbrian/go-idempotency}" "$peer"
	git -C "$peer" checkout --quiet "$commit"
fi
if head=$(git -C "$peer" rev-parse HEAD 2>/dev/null) && [[ $head != "$commit"* ]]; then
	echo "note: the peer checkout is at ${head:0:12}, peerbench's go.mod names $commit" >&2
fi

cat >"$tmp/go.work" <<WORK
go 1.26.8

use $root/scripts/peerbench

replace github.com/faustbrian/go-idempotency => $peer
WORK
cd "$root/scripts/peerbench"
GOWORK=$tmp/go.work go build -o "$tmp/peerbench" .
echo "peer: github.com/faustbrian/go-idempotency at $(git -C "$peer" rev-parse --short=12 HEAD 2>/dev/null || echo "$peer"); $(go version); $(nproc) cores"
"$tmp/peerbench" "$@"
