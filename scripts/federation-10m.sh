#!/usr/bin/env bash
# Issue 35's federation run (not in CI: minutes, not seconds): two emulated
# Consul datacenters (dc1 the primary, dc2), two `idgen serve` nodes each
# on distinct datacenter ids (1 and 2), and `idgen gen --discover consul`
# through each datacenter's agent at once, COUNT IDs in all (10 M by
# default); every ID is then checked for a repeat.
#
#   scripts/federation-10m.sh [COUNT]      # IDGEN=..., CONSUL_TESTSERVER=... to pick binaries
set -euo pipefail
count=${1:-10000000}
idgen=${IDGEN:-target/release/idgen}
consul=${CONSUL_TESTSERVER:-target/release/consul-testserver}
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
# Ports free now, all distinct (held open together while chosen).
ports=($(python3 -c '
import socket
ss = [socket.socket() for _ in range(10)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'))
p1=${ports[0]}; p2=${ports[1]}
"$consul" --listen "127.0.0.1:$p1" --add-datacenter "dc2=127.0.0.1:$p2" >"$work/consul.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$p2/v1/status/leader" >/dev/null && break; sleep 0.1; done
node() { # name agent-port datacenter-id grpc-port http-port
    cat >"$work/$1.toml" <<TOML
[store]
backend = "consul"
[consul]
address = "http://127.0.0.1:$2"
cluster = "federation"
primary_datacenter = "dc1"
[node]
instance_id = "$1"
datacenter_id = $3
[server]
grpc_listen = "127.0.0.1:$4"
http_listen = "127.0.0.1:$5"
TOML
    "$idgen" serve --config "$work/$1.toml" >"$work/$1.log" 2>&1 &
    pids+=($!)
}
node a1 "$p1" 1 "${ports[2]}" "${ports[3]}"
node a2 "$p1" 1 "${ports[4]}" "${ports[5]}"
node b1 "$p2" 2 "${ports[6]}" "${ports[7]}"
node b2 "$p2" 2 "${ports[8]}" "${ports[9]}"
for n in a1 a2 b1 b2; do
    for _ in $(seq 300); do grep -qE 'serve: ready|"ready"' "$work/$n.log" && break; sleep 0.1; done
    grep -qE 'serve: ready|"ready"' "$work/$n.log" || { echo "$n did not start:"; cat "$work/$n.log"; exit 1; }
done
# Each datacenter's two nodes passing their Consul check (the first probe
# comes up to one check interval after registration).
passing() { curl -fs "http://127.0.0.1:$1/v1/health/service/idgen?passing" |
    python3 -c 'import json, sys; print(len(json.load(sys.stdin)))'; }
for p in "$p1" "$p2"; do
    for _ in $(seq 300); do [ "$(passing "$p")" = 2 ] && break; sleep 0.1; done
    [ "$(passing "$p")" = 2 ] || { echo "the nodes of the agent on port $p are not passing"; exit 1; }
done
half=$((count / 2))
start=$(date +%s.%N)
"$idgen" gen --discover consul --consul "http://127.0.0.1:$p1" -n "$half" >"$work/dc1.ids" &
g1=$!
"$idgen" gen --discover consul --consul "http://127.0.0.1:$p2" -n "$((count - half))" >"$work/dc2.ids" &
g2=$!
wait "$g1" "$g2"
end=$(date +%s.%N)
total=$(cat "$work/dc1.ids" "$work/dc2.ids" | wc -l)
dups=$(sort -n -S 25% "$work/dc1.ids" "$work/dc2.ids" | uniq -d | wc -l)
echo "IDs: $total (dc1 $(wc -l <"$work/dc1.ids"), dc2 $(wc -l <"$work/dc2.ids")); duplicates: $dups"
echo "seconds: $(python3 -c "print(round($end - $start, 2))")"
# Which datacenter id and worker ids each side's IDs carry (twitter layout:
# worker 5 bits above a 12-bit sequence, datacenter 5 bits above that).
for dc in dc1 dc2; do
    python3 - "$work/$dc.ids" "$dc" <<'PY'
import sys
seen = set()
with open(sys.argv[1]) as f:
    for line in f:
        v = int(line)
        seen.add(((v >> 17) & 31, (v >> 12) & 31))
print(sys.argv[2], "(datacenter id, worker id) pairs:", sorted(seen))
PY
done
[ "$total" -eq "$count" ] && [ "$dups" -eq 0 ]
