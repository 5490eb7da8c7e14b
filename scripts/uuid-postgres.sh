#!/usr/bin/env bash
# uuid-postgres.sh — UUIDv7 from an idgen node come back from a PostgreSQL
# `uuid` primary key in the order the node issued them (issue 36).
#
# Usage: scripts/uuid-postgres.sh [count=100000] [runs=10]
#
# What it does
#   1. Starts one node (embedded store, the default) in a temporary
#      directory, on free loopback ports.
#   2. Takes <count> UUIDs with `idgen gen --uuid` in <runs> runs of the
#      command (each a new connection, each in GenUuids calls of a quarter
#      of its share), appending them to a file in the order they came back:
#      the issue order.
#   3. Starts a throw-away PostgreSQL (initdb, 127.0.0.1 on a free port),
#      creates `t (u uuid PRIMARY KEY)` and loads the UUIDs in a shuffled
#      order (`shuf`, then COPY), so the table's physical order says
#      nothing about the issue order.
#   4. Checks that `SELECT u FROM t ORDER BY u` returns exactly the issue
#      order: PostgreSQL compares `uuid` values as 16 unsigned bytes, the
#      order the node promises (strictly increasing per node). Any
#      difference prints the first differing line and exits 1; a
#      duplicate fails the primary key, also exit 1.
#   Prints `uuid_postgres_ok=<count>` last on success.
#
# The binary: IDGEN_BIN (default target/debug/idgen; built with
# `cargo build --bin idgen` when missing).
# PostgreSQL: the binaries scripts/pg-nextval-bench.sh uses (Debian's
# /usr/lib/postgresql/<highest>/bin, else PATH); when missing, as root (or
# with passwordless sudo) it installs them with the same step:
#   apt-get install -y --no-install-recommends postgresql postgresql-contrib
# PostgreSQL refuses to run as root: as root the server and psql run as
# the system user idgen-pg (created if missing; falls back to postgres,
# then nobody), or PG_BENCH_USER.
# Environment: UUID_PG_TMPDIR parent of the temporary directory (default
# /var/tmp).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    echo "usage: $0 [count=100000] [runs=10]" >&2
    exit 2
}
[[ $# -le 2 ]] || usage
COUNT="${1:-100000}"
RUNS="${2:-10}"
[[ "$COUNT" =~ ^[1-9][0-9]*$ && "$RUNS" =~ ^[1-9][0-9]*$ ]] || usage
((RUNS <= COUNT)) || { echo "uuid-postgres: runs ($RUNS) must not exceed count ($COUNT)" >&2; exit 2; }

log() { printf '[uuid-postgres] %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# ---------------------------------------------------------------------------
# The idgen binary.
# ---------------------------------------------------------------------------
BIN="${IDGEN_BIN:-target/debug/idgen}"
if [[ ! -x "$BIN" ]]; then
    [[ -z "${IDGEN_BIN:-}" ]] || die "IDGEN_BIN=$BIN is not an executable"
    log "building $BIN (cargo build --bin idgen)"
    cargo build --quiet --bin idgen
fi
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"

# ---------------------------------------------------------------------------
# PostgreSQL binaries (found, else installed the way pg-nextval-bench.sh
# installs them).
# ---------------------------------------------------------------------------
IS_ROOT=0
[[ "$(id -u)" -eq 0 ]] && IS_ROOT=1
PG_BINDIR="$(for d in /usr/lib/postgresql/*/bin; do
    [[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/psql" ]] && echo "$d"
done | sort -V | tail -n1)"
tool() {
    if [[ -n "$PG_BINDIR" && -x "$PG_BINDIR/$1" ]]; then
        echo "$PG_BINDIR/$1"
    else
        command -v "$1" 2>/dev/null || true
    fi
}
have_tools() {
    local t
    for t in initdb pg_ctl postgres psql; do
        [[ -n "$(tool "$t")" ]] || return 1
    done
}
if ! have_tools; then
    priv=()
    if ((!IS_ROOT)); then
        command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null ||
            die "PostgreSQL (initdb, pg_ctl, psql) not found and not root. Install it first: apt-get install -y --no-install-recommends postgresql postgresql-contrib"
        priv=(sudo -n)
    fi
    log "installing PostgreSQL from Debian (postgresql postgresql-contrib)"
    "${priv[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${priv[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends postgresql postgresql-contrib
    PG_BINDIR="$(for d in /usr/lib/postgresql/*/bin; do
        [[ -x "$d/initdb" ]] && echo "$d"
    done | sort -V | tail -n1)"
    have_tools || die "PostgreSQL tools still missing after the install"
fi
INITDB="$(tool initdb)" PG_CTL="$(tool pg_ctl)" PSQL="$(tool psql)"

RUN_USER=""
if ((IS_ROOT)); then
    RUN_USER="${PG_BENCH_USER:-idgen-pg}"
    if ! id -u "$RUN_USER" >/dev/null 2>&1; then
        if [[ -z "${PG_BENCH_USER:-}" ]] &&
            useradd -r -M -d /nonexistent -s /usr/sbin/nologin "$RUN_USER" 2>/dev/null; then
            log "created system user $RUN_USER"
        elif [[ -z "${PG_BENCH_USER:-}" ]] && id -u postgres >/dev/null 2>&1; then
            RUN_USER=postgres
        elif [[ -z "${PG_BENCH_USER:-}" ]] && id -u nobody >/dev/null 2>&1; then
            RUN_USER=nobody
        else
            die "no unprivileged user to run PostgreSQL as (set PG_BENCH_USER)"
        fi
    fi
    [[ "$(id -u "$RUN_USER")" -ne 0 ]] || die "PG_BENCH_USER must not be root"
fi
# Runs a command as the cluster's owner (input and output redirections
# stay this shell's, so the owner needs no access to the UUID files).
as_pg() {
    if ((IS_ROOT)); then
        runuser -u "$RUN_USER" -- "$@"
    else
        "$@"
    fi
}

# ---------------------------------------------------------------------------
# Temporary directory, and cleanup of what this script started.
# ---------------------------------------------------------------------------
PARENT="${UUID_PG_TMPDIR:-/var/tmp}"
[[ -d "$PARENT" && -w "$PARENT" ]] || PARENT="${TMPDIR:-/tmp}"
WORK="$(mktemp -d "$PARENT/uuid-postgres.XXXXXX")"
# Unix socket paths are limited to ~107 bytes.
if ((${#WORK} > 80)); then
    rmdir "$WORK"
    WORK="$(mktemp -d /tmp/uuid-postgres.XXXXXX)"
fi
DATA="$WORK/pgdata"
NODE_PID=""
PG_STARTED=0
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if ((PG_STARTED)); then
        as_pg "$PG_CTL" -D "$DATA" -m fast -w -t 20 stop >/dev/null 2>&1 || {
            pid="$(head -n1 "$DATA/postmaster.pid" 2>/dev/null || true)"
            [[ "$pid" =~ ^[0-9]+$ ]] && kill -9 "$pid" 2>/dev/null || true
        }
    fi
    if [[ -n "$NODE_PID" ]]; then
        kill -TERM "$NODE_PID" 2>/dev/null || true
        wait "$NODE_PID" 2>/dev/null || true
    fi
    rm -rf -- "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
((IS_ROOT)) && chown "$RUN_USER" "$WORK"
chmod 700 "$WORK"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# ---------------------------------------------------------------------------
# 1. The node.
# ---------------------------------------------------------------------------
GRPC="$(free_port)" HTTP="$(free_port)"
cat >"$WORK/node.toml" <<TOML
[server]
grpc_listen = "127.0.0.1:$GRPC"
http_listen = "127.0.0.1:$HTTP"
[store]
path = "$WORK/node.redb"
init_if_missing = true
[log]
level = "warn"
TOML
"$BIN" serve --config "$WORK/node.toml" >"$WORK/node.log" 2>&1 &
NODE_PID=$!
ready=0
for _ in $(seq 1 500); do
    if curl -fs -o /dev/null "http://127.0.0.1:$HTTP/readyz"; then
        ready=1
        break
    fi
    kill -0 "$NODE_PID" 2>/dev/null || break
    sleep 0.02
done
((ready)) || { tail -20 "$WORK/node.log" >&2; die "the node did not become ready"; }
log "node ready on 127.0.0.1:$GRPC ($BIN)"

# ---------------------------------------------------------------------------
# 2. The UUIDs, in issue order.
# ---------------------------------------------------------------------------
ISSUED="$WORK/issued.txt"
: >"$ISSUED"
for ((run = 0; run < RUNS; run++)); do
    # Shares differ by at most one; each run's calls take a quarter of it.
    n=$(((COUNT + run) / RUNS))
    batch=$(((n + 3) / 4))
    "$BIN" gen --uuid --addr "127.0.0.1:$GRPC" -n "$n" --batch "$batch" >>"$ISSUED"
done
got="$(wc -l <"$ISSUED")"
((got == COUNT)) || die "asked for $COUNT UUIDs, got $got"
grep -qvE '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' "$ISSUED" &&
    die "not every line is a lowercase UUIDv7 with variant 10: $(grep -vE '^[0-9a-f]{8}-[0-9a-f]{4}-7' "$ISSUED" | head -1)"
log "took $COUNT UUIDs in $RUNS runs of idgen gen --uuid: $(head -1 "$ISSUED") .. $(tail -1 "$ISSUED")"
shuf "$ISSUED" >"$WORK/shuffled.txt"
cmp -s "$ISSUED" "$WORK/shuffled.txt" && ((COUNT > 2)) && die "shuf left the order as it was"

# ---------------------------------------------------------------------------
# 3. PostgreSQL, the table, the shuffled load.
# ---------------------------------------------------------------------------
as_pg "$INITDB" -D "$DATA" -U postgres -A trust -E UTF8 --no-locale >"$WORK/initdb.log" 2>&1 ||
    { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
PG_PORT="$(free_port)"
cat >>"$DATA/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$WORK'
EOF
PG_STARTED=1
(cd "$WORK" && as_pg "$PG_CTL" -D "$DATA" -l "$DATA/server.log" -w -t 30 start >/dev/null) ||
    { tail -20 "$DATA/server.log" >&2; die "PostgreSQL did not start"; }
psql_do() { (cd "$WORK" && as_pg "$PSQL" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"); }
log "PostgreSQL $(psql_do -At -c 'SHOW server_version') on 127.0.0.1:$PG_PORT"
psql_do -c 'CREATE TABLE t (u uuid PRIMARY KEY)'
psql_do -c '\copy t FROM STDIN' <"$WORK/shuffled.txt"
rows="$(psql_do -At -c 'SELECT count(*) FROM t')"
((rows == COUNT)) || die "the table holds $rows rows, not $COUNT"

# ---------------------------------------------------------------------------
# 4. ORDER BY gives the issue order.
# ---------------------------------------------------------------------------
psql_do -At -c 'SELECT u FROM t ORDER BY u' >"$WORK/ordered.txt"
if ! cmp -s "$ISSUED" "$WORK/ordered.txt"; then
    # cmp exits 1 on a difference: `|| true` keeps set -e from ending here.
    line="$(cmp "$ISSUED" "$WORK/ordered.txt" | sed -n 's/.* line \([0-9]*\).*/\1/p' || true)"
    log "issued:     $(sed -n "${line:-1}p" "$ISSUED") (line ${line:-?})"
    log "ORDER BY u: $(sed -n "${line:-1}p" "$WORK/ordered.txt")"
    die "SELECT u FROM t ORDER BY u differs from the issue order"
fi
log "SELECT u FROM t ORDER BY u returned all $COUNT UUIDs in issue order"
echo "uuid_postgres_ok=$COUNT"
