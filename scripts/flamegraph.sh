#!/usr/bin/env bash
# Where one node's CPU goes under `idgen bench` load: a flame graph.
#   - builds target/profiling/idgen (the release code with line tables and
#     every symbol; frame pointers on, so perf walks every stack cheaply);
#   - starts one embedded node (state file on disk, every commit fsync'd)
#     with segment, lease and strict enabled;
#   - runs `idgen bench` against it (1 connection, CONCURRENCY callers,
#     BATCH IDs per call) and samples the node with `perf record`
#     (cpu-clock, so it works where hardware counters do not);
#   - writes target/perf/flame-<mode>-c<concurrency>.svg (inferno) and
#     prints where the samples are, by thread and by the frames that
#     matter (the strict committer's fdatasync, redb, hyper/h2, wake-ups).
# Installs what it needs: Debian's linux-perf, and inferno from crates.io.
# Usage: scripts/flamegraph.sh [mode] [concurrency] [seconds] [batch]
#        (default: strict 16 5 1)
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-strict}"
conc="${2:-16}"
secs="${3:-5}"
batch="${4:-1}"
case "$mode" in
  snowflake) tag="" ;;
  segment) tag="perf" ;;
  lease) tag="" ;;
  strict) tag="perf/k" ;;
  *) echo "mode must be snowflake, segment, lease or strict, not $mode" >&2; exit 2 ;;
esac
if ! command -v perf >/dev/null; then
  apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null
fi
if ! command -v inferno-flamegraph >/dev/null; then
  cargo install --quiet inferno
fi
RUSTFLAGS="-C force-frame-pointers=yes" cargo build --quiet --profile profiling --bin idgen
cargo build --quiet --release --bin idgen
node_bin=target/profiling/idgen
bench_bin=target/release/idgen
out=target/perf
mkdir -p "$out"
# On disk, not tmpfs: the fsyncs must be real.
work=$(mktemp -d "${PERF_TMPDIR:-/var/tmp}/idgen-flame.XXXXXX")
# shellcheck source=lib/cluster.sh
source scripts/lib/cluster.sh
cat > "$work/node.toml" <<TOML
[node]
instance_id = "flame"
[server]
grpc_listen = "127.0.0.1:50871"
http_listen = "127.0.0.1:50872"
[store]
backend = "embedded"
path = "$work/state.redb"
init_if_missing = true
$(perf_mode_sections)
[log]
level = "error"
TOML
"$node_bin" serve --config "$work/node.toml" &
node_pid=$!
pids+=("$node_pid")
for _ in $(seq 1 500); do
  curl -fs -o /dev/null "http://127.0.0.1:50872/readyz" && break
  sleep 0.01
done
"$bench_bin" bench --addr http://127.0.0.1:50871 --connections 1 --concurrency "$conc" \
  --mode "$mode" --tag "$tag" --batch "$batch" --duration "$((secs + 3))s" --warmup 0s \
  > "$work/bench.txt" 2>&1 &
bench_pid=$!
sleep 2
perf record -q -F 999 -e cpu-clock -g -p "$node_pid" -o "$work/perf.data" -- sleep "$secs"
wait "$bench_pid"
tail -1 "$work/bench.txt"
name="flame-$mode-c$conc"
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf > "$out/$name.folded"
inferno-flamegraph --title "idgen $mode, embedded, c$conc x$batch (cpu-clock, $secs s)" \
  "$out/$name.folded" > "$out/$name.svg"
echo "wrote $out/$name.svg"
python3 - "$out/$name.folded" <<'PY'
import collections, sys
total, where = 0, collections.Counter()
rules = [  # (thread prefix, frame substring, label): first match wins
    ("idgen-strict", "fdatasync", "strict committer: fdatasync (kernel writeback)"),
    ("idgen-strict", "pwrite", "strict committer: pwrite64"),
    ("idgen-strict", "statx", "strict committer: statx (state file guard)"),
    ("idgen-strict", "redb", "strict committer: redb"),
    ("idgen-strict", "", "strict committer: other"),
    ("tokio", "h2::", "runtime: hyper/h2 (HTTP/2, incl. its socket I/O)"),
    ("tokio", "hyper", "runtime: hyper/h2 (HTTP/2, incl. its socket I/O)"),
    ("tokio", "epoll", "runtime: wake-ups (epoll, futex, scheduling)"),
    ("tokio", "futex", "runtime: wake-ups (epoll, futex, scheduling)"),
    ("tokio", "schedule", "runtime: wake-ups (epoll, futex, scheduling)"),
    ("tokio", "", "runtime: other (idgen, tonic, prost)"),
    ("", "", "other threads"),
]
for line in open(sys.argv[1]):
    stack, count = line.rsplit(" ", 1)
    count = int(count)
    total += count
    thread = stack.split(";", 1)[0]
    for prefix, frame, label in rules:
        if thread.startswith(prefix) and frame in stack:
            where[label] += count
            break
for label, count in where.most_common():
    print(f"{100 * count / max(total, 1):5.1f}%  {label}")
PY
