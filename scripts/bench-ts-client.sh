#!/usr/bin/env bash
# Benchmark (not part of CI): app-visible IDs per second of the npm client
# @idgen/client, prefetching snowflake IDs from three nodes in one Node
# event loop, against ioredis INCR on a local redis-server from the same
# loop. Prints each round, the medians and the ratio (issue 37's targets:
# at least 1,000,000 IDs/s and at least 20x), then 2 M calls without a
# kill (a control) and a failover run: one node SIGKILLed under the
# prefetch load (errors, duplicates, the longest call with the time it
# waited for a core and in the collector's pauses, p99.9).
#
#   scripts/bench-ts-client.sh [ROUNDS]
#
# Needs node and npm, redis-server (Debian package redis-server; installed
# with apt-get when missing), and the idgen and consul-testserver binaries:
# $IDGEN_BIN / $CONSUL_TESTSERVER, by default target/release/idgen and
# target/release/consul-testserver (cargo build --release --bin idgen
# --bin consul-testserver). The client is packed and installed into a
# scratch project with ioredis from npm, as a user would.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
rounds=${1:-5}
export IDGEN_BIN="${IDGEN_BIN:-$repo/target/release/idgen}"
export CONSUL_TESTSERVER="${CONSUL_TESTSERVER:-$repo/target/release/consul-testserver}"
for b in "$IDGEN_BIN" "$CONSUL_TESTSERVER"; do
  [ -x "$b" ] || { echo "bench-ts-client: $b is missing: cargo build --release --bin idgen --bin consul-testserver, or set IDGEN_BIN / CONSUL_TESTSERVER" >&2; exit 1; }
done
if ! command -v redis-server >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" != 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/idgen-bench-ts.XXXXXX")
pids=()
cluster_pid=""
cleanup() {
  # Closing the cluster's stdin makes it stop its nodes and the emulator.
  exec 3>&- 2>/dev/null || true
  [ -n "$cluster_pid" ] && wait "$cluster_pid" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

bash clients/typescript/scripts/packaged.sh "$work/app" >/dev/null
(cd "$work/app" && npm install --no-audit --no-fund --loglevel=error ioredis@5 >/dev/null)
cp clients/typescript/bench/ts-vs-redis.js "$work/app/"

redis_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
pids+=($!)

mkfifo "$work/hold"
node clients/typescript/bench/cluster.js <"$work/hold" >"$work/nodes" 2>"$work/cluster.log" &
cluster_pid=$!
exec 3>"$work/hold"
for _ in $(seq 1 600); do
  [ -s "$work/nodes" ] && break
  sleep 0.1
done
for _ in $(seq 1 100); do
  [ "$(wc -l <"$work/nodes")" -ge 2 ] && break
  sleep 0.1
done
nodes=$(head -n1 "$work/nodes")
victim=$(sed -n 2p "$work/nodes" | cut -d, -f1)
[ -n "$nodes" ] || { echo "bench-ts-client: the cluster did not start:" >&2; cat "$work/cluster.log" >&2; exit 1; }
for _ in $(seq 1 100); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done

echo "nodes: $nodes; redis-server on 127.0.0.1:$redis_port; node $(node --version); $(nproc) cores"
(cd "$work/app" && node ts-vs-redis.js "$nodes" "$redis_port" "$rounds" "$victim")
