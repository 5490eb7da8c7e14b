#!/usr/bin/env bash
# Cluster mode against single-node mode, on one machine:
#   - starts the Consul-compatible test server (consul/testserver) as a
#     process, three idgen nodes in cluster mode against it (default lease
#     timings: TTL 15 s, lock-delay 15 s), and one embedded single node;
#   - runs `idgen bench` (1 connection x 64 in flight) against node 1 of the
#     cluster and against the single node, alternating, for unary GenId and
#     GenIds batches of 1000, and prints the medians and their ratio.
# Usage: scripts/perf-cluster.sh [seconds-per-run] [rounds]   (default 5 3)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-5}"
rounds="${2:-3}"
cargo build --release --quiet --workspace
bin=target/release/idgen
work=$(mktemp -d)
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
node single 50751 50752 embedded
node c1 50761 50762 consul
node c2 50763 50764 consul
node c3 50765 50766 consul
echo "consul test server on $consul; cluster nodes c1..c3 serving, single node serving"

for batch in 1 1000; do
  for r in $(seq 1 "$rounds"); do
    for who in single:50751 cluster:50761; do
      "$bin" bench --addr "http://127.0.0.1:${who#*:}" --connections 1 --concurrency 64 \
        --batch "$batch" --duration "${secs}s" --warmup 1s --json \
        | python3 -c "import json,sys; r=json.load(sys.stdin)[0]; print('${who%%:*}', $batch, r['calls_per_sec'], r['ids_per_sec'], r['p99_us'], r['errors'])"
    done
  done
done > "$work/results"
python3 - "$work/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for batch in ("1", "1000"):
    med = {}
    for who in ("single", "cluster"):
        v = [r for r in rows if r[0] == who and r[1] == batch]
        med[who] = (statistics.median(float(r[2]) for r in v),
                    statistics.median(float(r[3]) for r in v),
                    statistics.median(float(r[4]) for r in v),
                    sum(int(r[5]) for r in v))
    kind = "unary GenId" if batch == "1" else "GenIds x1000"
    for who in ("single", "cluster"):
        c, i, p99, err = med[who]
        print(f"{kind:13} {who:8} {c:10.0f} calls/s {i:12.0f} IDs/s  p99 {p99:6.0f} us  errors {err}")
    print(f"{kind:13} cluster / single: {med['cluster'][1] / med['single'][1] * 100:.1f}% (medians of {len(v)} alternating runs)")
PY
