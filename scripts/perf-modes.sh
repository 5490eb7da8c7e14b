#!/usr/bin/env bash
# Throughput of segment, lease and strict modes over gRPC on one machine,
# and strict mode against PostgreSQL `SELECT nextval()`:
#   - one embedded node (state file on disk, every commit fsync'd) with
#     segment, lease and strict enabled;
#   - the Consul-compatible test server as a process and three cluster
#     nodes with strict enabled;
#   - `idgen bench`: segment and lease GenIds x1000 (1 connection x 64 in
#     flight); strict unary GenId with 16 callers (1 connection x 16) on the
#     embedded node (alternating with a bare tonic counter server under the
#     same load, the gRPC ceiling) and with PostgreSQL nextval via pgbench -c 16
#     (scripts/pg-nextval-bench.sh, which installs PostgreSQL from Debian
#     if needed); strict with 16 and 64 callers on one cluster node of the
#     Consul test server, and with 48 callers spread over all 3 cluster
#     nodes through the client (`--discover consul`), on one key and on
#     100 keys (`--keys 100`).
# Prints medians over the rounds. Usage:
#   scripts/perf-modes.sh [--raft-write-ms MS] [--consistent-read-ms MS]
#                         [seconds-per-run] [rounds]   (default 10 3)
# The two flags set the test server's latency model (consul/README.md,
# "The test server"): with them the strict-consul runs (c16 and c64) mean
# something for a real Consul; without them Consul answers at once.
set -euo pipefail
cd "$(dirname "$0")/.."
consul_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --raft-write-ms | --consistent-read-ms)
      [ $# -ge 2 ] || { echo "$1 needs milliseconds" >&2; exit 2; }
      consul_args+=("$1" "$2")
      shift 2
      ;;
    *) break ;;
  esac
done
secs="${1:-10}"
rounds="${2:-3}"
cargo build --release --quiet --workspace
bin=target/release/idgen
# On disk, not tmpfs: the fsyncs must be real.
work=$(mktemp -d "${PERF_TMPDIR:-/var/tmp}/idgen-perf.XXXXXX")
# shellcheck source=lib/cluster.sh
source scripts/lib/cluster.sh
start_consul

node() { # name grpc-port http-port backend
  cat > "$work/$1.toml" <<TOML
[node]
instance_id = "$1"
[server]
grpc_listen = "127.0.0.1:$2"
http_listen = "127.0.0.1:$3"
[store]
backend = "$4"
path = "$work/$1.redb"
init_if_missing = true
[consul]
address = "http://$consul"
cluster = "perf"
$(perf_mode_sections)
[log]
level = "warn"
TOML
  "$bin" serve --config "$work/$1.toml" &
  pids+=($!)
  for _ in $(seq 1 500); do
    curl -fs -o /dev/null "http://127.0.0.1:$3/readyz" && return 0
    sleep 0.01
  done
  echo "node $1 did not become ready" >&2
  exit 1
}
node single 50851 50852 embedded
node cluster 50861 50862 consul
node cluster2 50863 50864 consul
node cluster3 50865 50866 consul
wait_passing 3
echo "embedded node and 3 cluster nodes (consul test server on $consul) serving"

run() { # label port mode tag batch concurrency
  "$bin" bench --addr "http://127.0.0.1:$2" --connections 1 --concurrency "$6" \
    --mode "$3" --tag "$4" --batch "$5" --duration "${secs}s" --warmup 2s --json \
    | python3 -c "import json,sys; r=json.load(sys.stdin)[0]; print('$1', r['calls_per_sec'], r['ids_per_sec'], r['p99_us'], r['errors'], r['order_violations'])"
}
# cluster LABEL TAG KEYS CONCURRENCY: strict through the client to all 3
# cluster nodes (found through Consul), on one key or spread over KEYS.
cluster() {
  "$bin" bench --discover consul --consul "http://$consul" --concurrency "$4" \
    --mode strict --tag "$2" --keys "$3" --duration "${secs}s" --warmup 2s --json \
    | python3 -c "import json,sys; r=json.load(sys.stdin)[0]; print('$1', r['calls_per_sec'], r['ids_per_sec'], r['p99_us'], r['errors'], r['order_violations'])"
}
for r in $(seq 1 "$rounds"); do
  run segment-x1000 50851 segment perf 1000 64
  run lease-x1000 50851 lease "" 1000 64
  # Strict on the embedded node, alternating in one bench process with a
  # bare tonic counter server under the same load (the gRPC ceiling here).
  "$bin" bench --addr "http://127.0.0.1:50851" --connections 1 --concurrency 16 \
    --mode strict --tag perf/k --batch 1 --duration "${secs}s" --warmup 2s \
    --baseline --rounds 1 --json \
    | python3 -c "
import json, sys
for r in json.load(sys.stdin):
    label = 'bare-tonic-c16' if r['label'].startswith('bare') else 'strict-embedded-c16'
    print(label, r['calls_per_sec'], r['ids_per_sec'], r['p99_us'], r['errors'], r['order_violations'])"
  tps=$(bash scripts/pg-nextval-bench.sh 16 "$secs" 2>/dev/null | sed -n 's/^pg_nextval_tps=//p')
  echo "postgres-nextval-c16 ${tps:-0} ${tps:-0} 0 0 0"
  run strict-consul-c16 50861 strict perf/k 1 16
  run strict-consul-c64 50861 strict perf/k 1 64
  cluster strict-consul-3nodes-c48-1key perf/k 1 48
  cluster strict-consul-3nodes-c48-100keys perf/m 100 48
done | tee "$work/results"
python3 - "$work/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
labels = []
for r in rows:
    if r[0] not in labels:
        labels.append(r[0])
med = {}
for label in labels:
    v = [r for r in rows if r[0] == label]
    calls = statistics.median(float(r[1]) for r in v)
    ids = statistics.median(float(r[2]) for r in v)
    p99 = statistics.median(float(r[3]) for r in v)
    errors = sum(int(r[4]) for r in v)
    viol = sum(int(r[5]) for r in v)
    med[label] = ids
    print(f"{label:22} {calls:12.0f} calls/s {ids:14.0f} IDs/s  p99 {p99:7.0f} us  errors {errors}  order violations {viol}  ({len(v)} runs, medians)")
if med.get("postgres-nextval-c16"):
    print(f"strict embedded / postgres nextval: {med['strict-embedded-c16'] / med['postgres-nextval-c16']:.2f}x")
if med.get("bare-tonic-c16"):
    print(f"strict embedded / bare tonic counter (same load): {med['strict-embedded-c16'] / med['bare-tonic-c16']:.2f}x")
PY
