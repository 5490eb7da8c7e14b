#!/usr/bin/env bash
# What an application gets through idgen-client, on this machine:
#   - starts the Consul-compatible test server and three idgen nodes in
#     cluster mode (release build), all on loopback;
#   - runs client/examples/load.rs (the client found through Consul, with
#     prefetch) on 1 and 2 threads, with one refill at a time and with up to
#     6 in flight (the default), alternating: IDs/s, p50/p99/p99.9/max of
#     single next_id calls, refill stalls included, and the histogram of
#     calls that waited over 1 ms; then one thread paced at 6 M IDs/s (an
#     application's steady load) for the waits on a refill;
#   - runs Redis INCR with `redis-benchmark -t incr -c 50` against Debian's
#     redis-server started on a loopback port (installed if missing) and
#     stopped after, once without persistence and once with appendfsync
#     always (scripts/lib/redis.sh);
#   - failover: kills (SIGKILL) a node while the load runs, once with
#     prefetch and once with one call per ID, and prints the histogram of
#     calls that took over 1 ms (the stalls) and the longest one, against
#     the client's 2 s deadline.
# Usage: scripts/bench-client.sh [seconds-per-run]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-5}"
cargo build --release --quiet --workspace --bins --example load
bin=target/release/idgen
load=target/release/examples/load
# On disk, not tmpfs: Redis's appendfsync always must really fsync.
work=$(mktemp -d "${PERF_TMPDIR:-/var/tmp}/idgen-bench-client.XXXXXX")
# shellcheck source=lib/cluster.sh
source scripts/lib/cluster.sh
# shellcheck source=lib/redis.sh
source scripts/lib/redis.sh
start_consul

declare -A node_pid
node() { # name grpc-port http-port
  cat > "$work/$1.toml" <<TOML
[node]
instance_id = "$1"
[server]
grpc_listen = "127.0.0.1:$2"
http_listen = "127.0.0.1:$3"
[store]
backend = "consul"
[consul]
address = "http://$consul"
cluster = "bench-client"
check_interval = "1s"
[log]
level = "warn"
TOML
  "$bin" serve --config "$work/$1.toml" &
  node_pid[$1]=$!
  pids+=($!)
  for _ in $(seq 1 500); do
    curl -fs -o /dev/null "http://127.0.0.1:$3/readyz" && return 0
    sleep 0.01
  done
  echo "node $1 did not become ready" >&2
  exit 1
}
node c1 50861 50862
node c2 50863 50864
node c3 50865 50866
wait_passing 3
echo "== consul test server on $consul; 3 idgen nodes passing"

echo "== client with prefetch (snowflake), ${secs}s per run; refills_in_flight 1 is one refill at a time (the client before it kept ahead)"
for t in 1 2; do
  for r in 1 6; do
    "$load" --consul "http://$consul" --threads "$t" --seconds "$secs" --mode prefetch --refills-in-flight "$r"
  done
done
echo "== client paced at 6 M IDs/s on one thread (steady state, 1 s warm-up left out): buffer_waits_over_1ms are the calls that waited over 1 ms for a refill"
"$load" --consul "http://$consul" --threads 1 --seconds "$secs" --warmup 1 --rate 6000000 --mode prefetch
echo "== client, one GenId call per ID (no prefetch), 2 threads"
"$load" --consul "http://$consul" --threads 2 --seconds "$secs" --mode call

echo "== Redis INCR (redis-benchmark -t incr -c 50 -n 500000), plain and with appendfsync always"
echo "INCR, no persistence: $(redis_incr_bench no 50 500000) requests per second"
echo "INCR, appendfsync always (fsync'd per write, like strict): $(redis_incr_bench always 50 500000) requests per second"

echo "== failover: SIGKILL of a node under load (deadline 2 s)"
for mode in prefetch call; do
  victim=c1; [ "$mode" = call ] && victim=c2
  "$load" --consul "http://$consul" --threads 2 --seconds 6 --mode "$mode" --deadline-ms 2000 --check-distinct > "$work/failover.json" &
  lp=$!
  sleep 2
  kill -KILL "${node_pid[$victim]}"
  echo "killed $victim during the $mode run"
  wait "$lp"
  cat "$work/failover.json"
done
