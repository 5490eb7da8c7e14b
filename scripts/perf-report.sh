#!/usr/bin/env bash
# Every figure of docs/PERFORMANCE.md's table in one run, with its
# baseline from the same run, written to target/perf/report.md and
# target/perf/report.json (medians over the rounds, ratios against the
# baselines, the machine: nproc, CPU model, load average before and after,
# the commit and the date).
#
# Figures (each round runs all of them in turn, so the machine's noise
# hits a figure and its baseline alike):
#   - single node: unary GenId and GenIds x1000 (1 connection x 64), each
#     alternating with a bare tonic counter server (`idgen bench --baseline`);
#   - UUIDv7: GenUuids x1000 (`idgen bench --uuid`, 1 x 64) right after
#     GenIds x1000 on the same node, against a bare counter answering
#     16-byte runs; and, release only (not with --smoke), criterion's one
#     UUID against one snowflake ID in process (`cargo bench --bench
#     generator -- uuid/issuer_`: Issuer::gen_uuid, the GenUuid path,
#     against Issuer::gen_id, and per ID in batches of 1000), with the
#     difference (target: at most +40 ns);
#   - modes: segment and lease GenIds x1000 on an embedded node;
#   - strict: unary, 16 and 64 callers, embedded (fsync'd) against bare tonic,
#     and on the Consul test server; its peers PostgreSQL `nextval` and
#     `UPDATE ... RETURNING` with synchronous_commit = on
#     (scripts/pg-nextval-bench.sh);
#   - client vs Redis: client/examples/load.rs (one thread, prefetch, 3
#     nodes found through Consul; flat out, and paced at 6 M IDs/s for the
#     waits on a refill) against `redis-benchmark -t incr -c 50`,
#     plain and with appendfsync always (scripts/lib/redis.sh);
#   - the Python and npm clients (not with --smoke): scripts/bench-python-client.sh
#     and scripts/bench-ts-client.sh, app-visible IDs/s from one thread /
#     event loop against redis-py / ioredis INCR from the same one, and a
#     node SIGKILLed under prefetch (errors, duplicates, longest call);
#   - TLS: unary GenId on a TLS 1.3 node (`idgen tls dev-certs`) against a
#     plaintext node;
#   - formatted: GenFormatted (the development config's `orders` format) against GenId.
#   - hiding volume: GenIds x1000 of a hidden snowflake node (`[layout]
#     hide = "sortable"`, 2 version bits, so 1,024 IDs per ms) against a
#     plain node of the same internal layout (`sequence_bits = 10`) and
#     the plain twitter node, and a hidden segment tag against a plain one
#     and against a plain one whose IDs are as wide
#     (same step, same node), each right after its plain twin.
#
# Usage: scripts/perf-report.sh [secs] [rounds] [--smoke] [--hidden-only] [--update-readme]
#   secs    seconds per measured run (default 5), rounds (default 3)
#   --smoke one second per figure, one round, the debug build the tests
#           already made, peers only where already installed (CI checks the
#           report is produced and well formed; it asserts no figure)
#   --hidden-only  only the hiding-volume figures and their plain twins
#           (a partial report: never written to the docs)
#   --update-readme  rewrite docs/PERFORMANCE.md's table (between
#           `<!-- perf-table:begin -->` and `<!-- perf-table:end -->`)
#           from this report
# Environment: PERF_PROFILE=debug|release (default release; debug with
# --smoke), PERF_TMPDIR (default /var/tmp: on disk, so fsyncs are real).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=5 rounds=3 smoke=0 update_readme=0 hidden_only=0
positional=()
for a in "$@"; do
  case "$a" in
    --smoke) smoke=1 ;;
    --update-readme) update_readme=1 ;;
    --hidden-only) hidden_only=1 ;;
    -h|--help) sed -n '2,50p' "$0"; exit 0 ;;
    -*) echo "perf-report: unknown option $a (see --help)" >&2; exit 2 ;;
    *) positional+=("$a") ;;
  esac
done
[ "${#positional[@]}" -gt 0 ] && secs="${positional[0]}"
[ "${#positional[@]}" -gt 1 ] && rounds="${positional[1]}"
[ "${#positional[@]}" -gt 2 ] && { echo "perf-report: at most [secs] [rounds]" >&2; exit 2; }
if [ "$smoke" = 1 ]; then secs=1 rounds=1; fi
[[ "$secs" =~ ^[1-9][0-9]*$ && "$rounds" =~ ^[1-9][0-9]*$ ]] || {
  echo "perf-report: secs and rounds are whole numbers above 0, got '$secs' '$rounds'" >&2; exit 2; }
profile="${PERF_PROFILE:-release}"
[ "$smoke" = 1 ] && profile="${PERF_PROFILE:-debug}"
warmup=2; [ "$smoke" = 1 ] && warmup=0

if [ "$profile" = release ]; then
  cargo build --release --quiet --workspace --bins --example load
  [ "$smoke" = 1 ] || cargo bench --quiet --bench generator --no-run
  dir=target/release
else
  cargo build --quiet --workspace --bins --example load
  dir=target/debug
fi
bin="$dir/idgen"
load="$dir/examples/load"
out=target/perf
mkdir -p "$out"
work=$(mktemp -d "${PERF_TMPDIR:-/var/tmp}/idgen-perf-report.XXXXXX")
# shellcheck source=lib/cluster.sh
source scripts/lib/cluster.sh
# shellcheck source=lib/redis.sh
source scripts/lib/redis.sh
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# Hidden namespaces: every node unwraps its hide keys with this master key
# (made up for this run), and the admin token creates the keys and tags.
IDGEN_HIDE_MASTER_KEY=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
export IDGEN_HIDE_MASTER_KEY
admin_token=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
start_consul "$dir"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# node NAME BACKEND [TLS-DIR] [EXTRA-TOML]: starts a node on free ports,
# sets $grpc.
node() {
  local name=$1 backend=$2 tls=${3:-} extra=${4:-} http
  grpc=$(free_port); http=$(free_port)
  {
    printf '[node]\ninstance_id = "%s"\n[server]\n' "$name"
    printf 'grpc_listen = "127.0.0.1:%s"\nhttp_listen = "127.0.0.1:%s"\n' "$grpc" "$http"
    if [ -n "$tls" ]; then
      printf '[server.tls]\ncert = "%s/node.pem"\nkey = "%s/node-key.pem"\n' "$tls" "$tls"
    fi
    printf '[store]\nbackend = "%s"\npath = "%s/%s.redb"\ninit_if_missing = true\n' "$backend" "$work" "$name"
    printf '[consul]\naddress = "http://%s"\ncluster = "perf-report"\ncheck_interval = "1s"\n' "$consul"
    printf '[segment]\nenabled = true\nauto_create = true\ndefault_step = 1000000\nmax_step = 100000000\n'
    printf '[lease]\nenabled = true\nblock = 10000000\n[strict]\nenabled = true\n'
    printf '[formatted]\nblock = 1000\n'
    printf '[[formats]]\nname = "orders"\ntemplate = "{yyyy}{MM}{dd}{param:biz:2:digits}{token:2:digits}{seq:8}"\nzone = "Asia/Shanghai"\nreset = "day"\n'
    printf '[log]\nlevel = "warn"\n[admin]\ntoken = "%s"\n' "$admin_token"
    printf '%b' "$extra"
  } > "$work/$name.toml"
  "$bin" serve --config "$work/$name.toml" > "$work/$name.log" 2>&1 &
  pids+=($!)
  local scheme=http; [ -n "$tls" ] && scheme=https
  for _ in $(seq 1 1000); do
    curl -fsk -o /dev/null "$scheme://127.0.0.1:$http/readyz" && return 0
    sleep 0.02
  done
  echo "perf-report: node $name did not become ready:" >&2
  tail -20 "$work/$name.log" >&2
  exit 1
}

"$bin" tls dev-certs "$work/certs" > /dev/null
node single embedded; single=$grpc
# The hidden snowflake node, and a plain one with its internal layout
# (twitter with 2 of the 12 sequence bits given to the key version).
node hidden embedded "" '[layout]\nhide = "sortable"\nhide_key = "perf"\nhide_version_bits = 2\n'; hidden=$grpc
node seq10 embedded "" '[layout]\nsequence_bits = 10\n'; seq10=$grpc
admin() { "$bin" admin --addr "http://127.0.0.1:$1" --token "$admin_token" "${@:2}" > /dev/null; }
admin "$hidden" keys create perf
admin "$single" keys create perf
admin "$single" tags create hidden-perf --step 1000000 --hide-key perf
admin "$single" tags create plain-perf --step 1000000
# A plain twin whose IDs are as wide as the hidden tag's (40 bits: six
# bytes on the wire, like the hidden ones): the hidden tag against it is
# the permutation's cost alone, against plain-perf also the wider IDs'.
admin "$single" tags create plain-wide-perf --step 1000000 --initial 549755813888
if [ "$hidden_only" = 0 ]; then
  node tls embedded "$work/certs"; tls=$grpc
  node c1 consul; c1=$grpc
  node c2 consul
  node c3 consul
  wait_passing 3
fi

results="$work/results"
: > "$results"
# row FIGURE VALUE UNIT [P50_US P99_US]: one measurement of one round.
row() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" "${5:-}" >> "$results"; }

# bench NAME ADDR [idgen bench flags...]: rows NAME (and bare-NAME with
# --baseline), calls/s or IDs/s with p50 and p99. Hidden IDs' order is
# hidden too: their runs pass `--unordered`.
bench() {
  local name=$1 addr=$2; shift 2
  rm -f "$work/bench.json"
  "$bin" bench --addr "$addr" --connections 1 --duration "${secs}s" --warmup "${warmup}s" \
    --rounds 1 --json "$@" > "$work/bench.json"
  python3 - "$name" "$work/bench.json" >> "$results" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
for r in json.load(open(path)):
    label = name if not r["label"].startswith("bare") else "bare-" + name
    batch = r["ids"] / r["calls"] if r["calls"] else 1
    value, unit = (r["ids_per_sec"], "IDs/s") if batch > 1.5 else (r["calls_per_sec"], "calls/s")
    if r["errors"]:
        print(f"{label}-errors\t{r['errors']}\tcount\t\t")
    print(f"{label}\t{value:.0f}\t{unit}\t{r['p50_us']}\t{r['p99_us']}")
PY
}

# in_process: criterion's uuid group (one UUID and one snowflake ID
# through the issuer, and per ID in batches of 1000): rows of medians in
# ns, and the difference of the single ones (issue 36's target: a UUID at
# most 40 ns above a snowflake ID).
in_process() {
  cargo bench --quiet --bench generator -- 'uuid/issuer_' \
    --warm-up-time 1 --measurement-time "$secs" > "$work/criterion.out" 2>&1 || {
    echo "perf-report: cargo bench --bench generator failed:" >&2; tail -5 "$work/criterion.out" >&2; exit 1; }
  python3 - target/criterion/uuid >> "$results" <<'PY'
import json, os, sys
def median_ns(name):
    with open(os.path.join(sys.argv[1], name, "new", "estimates.json")) as f:
        return json.load(f)["median"]["point_estimate"]
snowflake, uuid = median_ns("issuer_snowflake_one"), median_ns("issuer_uuid_one")
print(f"snowflake-one-in-process\t{snowflake:.1f}\tns\t\t")
print(f"uuid-one-in-process\t{uuid:.1f}\tns\t\t")
print(f"uuid-minus-snowflake-one-in-process\t{uuid - snowflake:.1f}\tns\t\t")
print(f"snowflake-x1000-in-process-per-id\t{median_ns('issuer_snowflake_1000') / 1000:.2f}\tns\t\t")
print(f"uuid-x1000-in-process-per-id\t{median_ns('issuer_uuid_1000') / 1000:.2f}\tns\t\t")
PY
}

have_pg() { command -v pgbench >/dev/null || ls /usr/lib/postgresql/*/bin/pgbench >/dev/null 2>&1; }

# hidden_figures: each hidden figure right after its plain twin.
hidden_figures() {
  bench seq10-x1000-c64 "http://127.0.0.1:$seq10" --concurrency 64 --batch 1000
  bench hidden-sortable-x1000-c64 "http://127.0.0.1:$hidden" --concurrency 64 --batch 1000 --unordered
  bench plain-tag-x1000-c64 "http://127.0.0.1:$single" --concurrency 64 --batch 1000 --mode segment --tag plain-perf
  bench plain-wide-tag-x1000-c64 "http://127.0.0.1:$single" --concurrency 64 --batch 1000 --mode segment --tag plain-wide-perf
  bench hidden-tag-x1000-c64 "http://127.0.0.1:$single" --concurrency 64 --batch 1000 --mode segment --tag hidden-perf --unordered
}

for r in $(seq 1 "$rounds"); do
  echo "== round $r of $rounds (${secs}s per run)"
  if [ "$hidden_only" = 1 ]; then
    bench genids-x1000-c64 "http://127.0.0.1:$single" --concurrency 64 --batch 1000
    hidden_figures
    continue
  fi
  bench unary-c64 "http://127.0.0.1:$single" --concurrency 64 --batch 1 --baseline
  bench genids-x1000-c64 "http://127.0.0.1:$single" --concurrency 64 --batch 1000 --baseline
  bench uuid-x1000-c64 "http://127.0.0.1:$single" --concurrency 64 --batch 1000 --uuid --baseline
  [ "$smoke" = 0 ] && [ "$profile" = release ] && in_process
  bench segment-x1000-c64 "http://127.0.0.1:$single" --concurrency 64 --batch 1000 --mode segment --tag perf
  hidden_figures
  bench lease-x1000-c64 "http://127.0.0.1:$single" --concurrency 64 --batch 1000 --mode lease
  bench strict-embedded-c16 "http://127.0.0.1:$single" --concurrency 16 --mode strict --tag perf/k --baseline
  bench strict-embedded-c64 "http://127.0.0.1:$single" --concurrency 64 --mode strict --tag perf/k --baseline
  bench strict-consul-c16 "http://127.0.0.1:$c1" --concurrency 16 --mode strict --tag perf/k
  bench tls-unary-c64 "https://127.0.0.1:$tls" --concurrency 64 --ca "$work/certs/ca.pem"
  bench plain-unary-c64 "http://127.0.0.1:$single" --concurrency 64
  bench formatted-c64 "http://127.0.0.1:$single" --concurrency 64 --format orders --param biz=07
  if [ "$smoke" = 0 ] || have_pg; then
    bash scripts/pg-nextval-bench.sh 16 "$secs" > "$work/pg.out" 2> "$work/pg.err" || {
      echo "perf-report: pg-nextval-bench.sh failed:" >&2; tail -5 "$work/pg.err" >&2; exit 1; }
    row postgres-nextval-c16 "$(sed -n 's/^pg_nextval_tps=//p' "$work/pg.out")" calls/s
    row postgres-update-c16 "$(sed -n 's/^pg_update_tps=//p' "$work/pg.out")" calls/s
  fi
  # The client in steady state (a warm-up second left out): as fast as
  # one thread can take IDs, as it is (up to 6 refills in flight) and with
  # one refill at a time (as before it kept ahead), and paced at 6 M IDs/s
  # (an application's steady load), where the waits for a refill are the
  # figure: calls that found the buffer empty and waited over 1 ms.
  for run in 6 1 paced; do
    refills=$run rate=0
    [ "$run" = paced ] && refills=6 rate=6000000
    "$load" --consul "http://$consul" --threads 1 --seconds "$secs" --warmup "$warmup" \
      --mode prefetch --refills-in-flight "$refills" --rate "$rate" > "$work/load.json"
    python3 - "$work/load.json" "$run" >> "$results" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
suffix = {"6": "", "1": "-one-refill", "paced": "-paced-6M"}[sys.argv[2]]
per_10m = lambda n: f"{n * 10_000_000 / max(r['ids'], 1):.1f}"
waits = sum(r["buffer_waits_over_1ms"].values())
stalls = sum(r["stalls_over_1ms"].values())
print(f"client-prefetch-1t{suffix}\t{r['ids_per_sec']}\tIDs/s\t{r['p50_us']}\t{r['p99_us']}")
print(f"client-waits-over-1ms-per-10M{suffix}\t{per_10m(waits)}\tcount\t\t")
print(f"client-calls-over-1ms-per-10M{suffix}\t{per_10m(stalls)}\tcount\t\t")
PY
  done
  if [ "$smoke" = 0 ]; then
    # The Python and npm clients (issue 37), each against its Redis client
    # from the same thread / event loop, and a node SIGKILLed under their
    # prefetch: one round of each bench per round here (each starts its
    # own 3 nodes; not with --smoke: they install redis-py and ioredis).
    TEST_IDGEN_BIN="$PWD/$bin" TEST_CONSUL_TESTSERVER_BIN="$PWD/$dir/consul-testserver" \
      BENCH_RESULTS="$results" bash scripts/bench-python-client.sh 1 > "$work/bench-python.out"
    IDGEN_BIN="$PWD/$bin" CONSUL_TESTSERVER="$PWD/$dir/consul-testserver" \
      BENCH_RESULTS="$results" bash scripts/bench-ts-client.sh 1 > "$work/bench-ts.out"
  fi
  if [ "$smoke" = 0 ] || redis_installed; then
    # redis-benchmark counts requests, not seconds: sized to take about
    # $secs each on a 2-core machine (fsync'd INCR is ~50x slower).
    row redis-incr-c50-fsync-no "$(redis_incr_bench no 50 $((secs * 100000)))" calls/s
    row redis-incr-c50-fsync-always "$(redis_incr_bench always 50 $((secs * 2000)))" calls/s
  fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 scripts/perf_report.py "$results" "$out" \
  --secs "$secs" --rounds "$rounds" --profile "$profile" --smoke "$smoke" --hidden-only "$hidden_only" \
  --load-before "$load_before" --load-after "$load_after" \
  --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo -dirty)"
echo "== wrote $out/report.md and $out/report.json"
cat "$out/report.md"
if [ "$update_readme" = 1 ]; then
  python3 scripts/perf_report.py --update-readme docs/PERFORMANCE.md "$out/report.json"
  echo "== docs/PERFORMANCE.md table rewritten from $out/report.json"
fi
