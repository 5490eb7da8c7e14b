#!/usr/bin/env bash
# Benchmark of the Python client (docs/CLIENT-PYTHON.md), not part of CI:
# application-visible IDs per second from one thread calling next_id()
# with prefetch from a 3-node cluster (Consul emulator + 3 idgen nodes on
# 127.0.0.1), against redis-py INCR from the same thread on a local
# redis-server (Debian package `redis-server`). ROUNDS runs each (default
# 5), medians, and their ratio (the issue's targets: >= 1 M IDs/s, >= 20x
# INCR); then one node is SIGKILLed under the prefetch load: errors,
# duplicates and the longest next_id() call (target: 0, 0, < 50 ms).
#
#   scripts/bench-python-client.sh [ROUNDS]   # builds idgen and consul-testserver (debug)
#   TEST_IDGEN_BIN=... TEST_CONSUL_TESTSERVER_BIN=... scripts/bench-python-client.sh [ROUNDS]
#
# With debug builds of the nodes on the same machine the nodes are the
# limit (one GenIds of 10,000 snowflake IDs takes about 10 ms of a debug
# node on a loaded 2-core machine): pass a release idgen in TEST_IDGEN_BIN
# to measure the client. The buffer alone (refills with a 1 ms round trip)
# hands out 4-8 M IDs/s to one thread on the same machine.
#
# The client is installed from clients/python (its wheel, built by pip)
# with redis-py into ${TMPDIR:-/tmp}/idgen-bench-venv. With BENCH_RESULTS=FILE
# the medians are also appended to FILE as scripts/perf-report.sh's rows.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench-python-client: ROUNDS is a whole number above 0, got '$rounds'" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install redis-server)" >&2; exit 1; }
if [ -z "${TEST_IDGEN_BIN:-}" ] || [ -z "${TEST_CONSUL_TESTSERVER_BIN:-}" ]; then
  cargo build --quiet --bin idgen -p idgen --bin consul-testserver -p consul-testserver
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  export TEST_IDGEN_BIN="${TEST_IDGEN_BIN:-$target_dir/debug/idgen}"
  export TEST_CONSUL_TESTSERVER_BIN="${TEST_CONSUL_TESTSERVER_BIN:-$target_dir/debug/consul-testserver}"
fi
venv="${TMPDIR:-/tmp}/idgen-bench-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps ./clients/python
"$venv/bin/pip" install --quiet --disable-pip-version-check ./clients/python redis

work=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  --daemonize no >"$work/redis.log" 2>&1 &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null || true; rm -rf "$work"' EXIT

cd "$work"   # the installed package, not the source tree
GRPC_VERBOSITY=NONE REDIS_PORT="$port" ROUNDS="$rounds" PYTHONPATH="$OLDPWD/clients/python/tests" \
  "$venv/bin/python" - <<'PY'
import os, signal, statistics, sys, time

import redis
import fixture
import idgen_client

RUNS, IDS, INCRS, FAILOVER_IDS = int(os.environ["ROUNDS"]), 3_000_000, 100_000, 2_000_000

r = redis.Redis(host="127.0.0.1", port=int(os.environ["REDIS_PORT"]))
for _ in range(100):
    try:
        r.ping()
        break
    except redis.ConnectionError:
        time.sleep(0.05)
r.incr("bench")  # warm up


def incr_rate():
    incr = r.incr
    t = time.perf_counter()
    for _ in range(INCRS):
        incr("bench")
    return INCRS / (time.perf_counter() - t)


cluster = fixture.Cluster(3)
try:
    config = idgen_client.PrefetchConfig(size=10000, low=5000, max_refills=3)
    with idgen_client.Client(cluster.addrs(), prefetch=config) as client:
        p = client.prefetcher("snowflake")
        next_id = p.next_id
        for _ in range(200_000):  # warm up: buffers and refill lanes
            next_id()

        def id_rate():
            t = time.perf_counter()
            last = 0
            for _ in range(IDS):
                last = next_id()
            assert last > 0
            return IDS / (time.perf_counter() - t)

        ids = [id_rate() for _ in range(RUNS)]
        workers = {(next_id() >> 12) & 0x3FF for _ in range(100_000)}

        # SIGKILL of one node under the prefetch load: errors, duplicates
        # and the longest next_id() call (only the call is timed).
        seen, errors, longest = set(), 0, 0.0
        clock = time.perf_counter
        for i in range(FAILOVER_IDS):
            if i == FAILOVER_IDS // 4:
                os.kill(cluster.nodes[0].proc.pid, signal.SIGKILL)
            t = clock()
            try:
                value = next_id()
            except idgen_client.IdgenError:
                errors += 1
                continue
            took = clock() - t
            if took > longest:
                longest = took
            seen.add(value)
        duplicates = FAILOVER_IDS - errors - len(seen)
finally:
    cluster.close()
incrs = [incr_rate() for _ in range(RUNS)]
mi, mr = statistics.median(ids), statistics.median(incrs)
print("python client next_id, 1 thread, prefetch from 3 nodes: median %.0f IDs/s (runs: %s)"
      % (mi, ", ".join("%.0f" % x for x in ids)))
print("redis-py INCR, same thread, local redis-server:        median %.0f ops/s (runs: %s)"
      % (mr, ", ".join("%.0f" % x for x in incrs)))
print("ratio: %.1fx; nodes that served the last 100,000 IDs: %d" % (mi / mr, len(workers)))
print("failover (SIGKILL of one of 3 nodes under prefetch): %d errors, %d duplicates, "
      "longest next_id %.1f ms" % (errors, duplicates, longest * 1000))
if os.environ.get("BENCH_RESULTS"):
    # Rows for scripts/perf-report.sh: figure, value, unit (tab-separated).
    with open(os.environ["BENCH_RESULTS"], "a") as out:
        for row in (("python-client-prefetch-1t", "%.0f" % mi, "IDs/s"),
                    ("redis-py-incr-1t", "%.0f" % mr, "calls/s"),
                    ("python-client-sigkill-longest", "%.1f" % (longest * 1000), "ms"),
                    ("python-client-sigkill-errors", str(errors), "count"),
                    ("python-client-sigkill-duplicates", str(duplicates), "count")):
            out.write("\t".join(row) + "\n")
PY
