#!/usr/bin/env bash
# Reproduces docs/PERFORMANCE.md's figures for a single node:
#   - start-to-serving time (process start until /readyz answers 200),
#   - `idgen bench --baseline` for unary GenId (1 connection x 64 in flight)
#     and GenIds batches of 1000, against a bare tonic counter server,
#   - the server's resident memory (VmRSS now, VmHWM peak) under that load.
# Usage: scripts/perf.sh [seconds-per-case]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
cargo build --release --quiet
bin=target/release/idgen
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/perf.toml" <<TOML
[server]
grpc_listen = "127.0.0.1:50551"
http_listen = "127.0.0.1:50552"
[store]
path = "$work/state.redb"
[log]
level = "warn"
TOML
"$bin" init --config "$work/perf.toml" >/dev/null

t0=$(date +%s%N)
"$bin" serve --config "$work/perf.toml" &
pid=$!
for _ in $(seq 1 500); do
  if curl -fs -o /dev/null http://127.0.0.1:50552/readyz; then break; fi
  sleep 0.002
done
t1=$(date +%s%N)
echo "start to serving: $(( (t1 - t0) / 1000000 )) ms (process start until /readyz = 200)"

"$bin" bench --addr http://127.0.0.1:50551 --connections 1 --concurrency 64 \
  --batch 1 --duration "${secs}s" --warmup 2s --baseline --rounds 3
"$bin" bench --addr http://127.0.0.1:50551 --connections 1 --concurrency 64 \
  --batch 1000 --duration "${secs}s" --warmup 2s --baseline --rounds 3
grep -E 'VmRSS|VmHWM' "/proc/$pid/status"
kill -TERM "$pid"
wait "$pid" && echo "server exited 0 after SIGTERM"
