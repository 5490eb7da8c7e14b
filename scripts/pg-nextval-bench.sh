#!/usr/bin/env bash
# pg-nextval-bench.sh — PostgreSQL `SELECT nextval()` throughput, and a
# durable-per-call counter (`UPDATE counters SET v = v + 1 WHERE k = $1
# RETURNING v`), as reference points for idgen's strict mode.
#
# Usage: scripts/pg-nextval-bench.sh [clients=16] [seconds=10]
#
# What it measures
#   pgbench runs `SELECT nextval('bench_seq');` as one autocommit transaction
#   per call, from <clients> connections over TCP on 127.0.0.1, for <seconds>
#   seconds, against a throw-away cluster (initdb into a mktemp dir, stopped
#   and deleted on exit). The figure reported is pgbench's tps "without
#   initial connection time", i.e. IDs handed out per second. Then the
#   same for `UPDATE counters SET v = v + 1 WHERE k = :k RETURNING v` on
#   one row (one hot key, like one strict key): every call writes WAL and
#   gets a transaction id, so with synchronous_commit = on every commit
#   waits for its WAL fsync (group commit shares one fsync among the
#   commits waiting at that moment) — durable per call, like strict mode.
#   Output: both pgbench summaries, a few `info:` lines (PostgreSQL
#   version, nproc, WAL written per transaction), and as the last lines:
#       pg_update_tps=<number>
#       pg_nextval_tps=<number>
#
# Server settings: fsync=on and synchronous_commit=on (both PostgreSQL's
# defaults, set explicitly so nobody's postgresql.conf habits leak in): a
# commit that wrote WAL returns only after that WAL is fsynced — durable
# commits, like idgen's strict mode. The sequence keeps the default CACHE 1,
# so every call goes to the shared sequence page (no per-session blocks).
#
# Durability semantics — read before comparing numbers with idgen strict mode
# (checked against PostgreSQL's source, src/backend/commands/sequence.c and
# src/backend/access/transam/xact.c, and its documentation):
#   * sequence.c: `#define SEQ_LOG_VALS 32` — "We don't want to log each
#     fetching of a value from a sequence, so we pre-log a few fetches in
#     advance. In the event of crash we can lose (skip over) as many values as
#     we pre-logged." nextval_internal() writes a WAL record only when the
#     pre-logged values are used up (log_cnt, shared by all sessions, reaches
#     0) or on the first nextval after a checkpoint; that record stores the
#     state as it will be 32 fetches later.
#   * Only a nextval that writes such a record acquires a transaction id
#     ("so this transaction's commit will trigger a WAL flush and wait for
#     syncrep"). The other calls write no WAL and get no xid, and xact.c's
#     RecordTransactionCommit() returns without flushing anything for them.
#     So with CACHE 1 about 1 call in 32 waits for an fsync (fewer with
#     group commit); the rest return without any disk wait. The info: lines
#     print WAL bytes and WAL fsyncs per transaction to show it (PostgreSQL
#     15 on a 2-core ext4 machine: ~4.4 WAL bytes and one fsync per ~38
#     transactions).
#   * A crash skips the pre-logged values (a gap) once the covering WAL
#     record is on disk. The docs (Sequence Manipulation Functions, 9.17)
#     say the state change of nextval "might not have made its way to
#     persistent storage" if the cluster crashes before the calling
#     transaction commits, and to use a value outside the database only
#     after the nextval call has been committed. Note the commit of a
#     non-logging call does not itself flush WAL: its value is covered by a
#     record another session's transaction wrote, which may still be on its
#     way to disk.
#   So this number is PostgreSQL's best case: an fsync amortised over ~32
#   IDs, plus one network round trip and one transaction without an xid per
#   ID. `-M prepared` is used for the same reason (fair best case: no parse or
#   plan per call).
#
# Requirements: Debian/Ubuntu. If initdb/pgbench are missing, as root it runs
#   apt-get update && apt-get install -y --no-install-recommends \
#     postgresql postgresql-contrib
# (on Debian 12 pgbench is in the server package postgresql-<ver> — `dpkg -S`
# says postgresql-15 — not in postgresql-client-<ver> nor postgresql-contrib,
# which there is a metapackage for the contrib modules built into the server
# package; sid's postgresql-client-17 file list has no pgbench either. The
# `postgresql` metapackage pulls in server and client, so either way pgbench
# is there afterwards; the script checks and stops if not). Non-root without the
# binaries: it stops with a message (tries `sudo -n` only if sudo exists).
# PostgreSQL refuses to run as root: as root the server and pgbench run as
# the system user idgen-pg (created if missing; falls back to `postgres`,
# then `nobody`), override with PG_BENCH_USER=<user>.
#
# Environment: PG_BENCH_TMPDIR=<dir> parent of the throw-away cluster
#   (default /var/tmp, which Debian keeps on disk; /tmp may be tmpfs, where
#   fsync costs nothing and the comparison would be meaningless — the script
#   prints the filesystem type). PG_BENCH_USER as above.
set -euo pipefail

usage() {
    echo "usage: $0 [clients=16] [seconds=10]" >&2
    exit 2
}

[[ $# -le 2 ]] || usage
CLIENTS="${1:-16}"
DURATION="${2:-10}"
[[ "$CLIENTS" =~ ^[1-9][0-9]*$ ]] || usage
[[ "$DURATION" =~ ^[1-9][0-9]*$ ]] || usage
THREADS=2
((CLIENTS < THREADS)) && THREADS="$CLIENTS"
MAX_CONN=$((CLIENTS + 10))
DB=idgen_bench
PGSUPER=postgres # superuser name given to initdb -U

log() { printf '[pg-nextval-bench] %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

IS_ROOT=0
[[ "$(id -u)" -eq 0 ]] && IS_ROOT=1

# ---------------------------------------------------------------------------
# Locate (or install) the PostgreSQL binaries.
# Prefer Debian's /usr/lib/postgresql/<highest ver>/bin; fall back to PATH
# (this machine, for one, also has symlinks in /usr/local/bin).
# ---------------------------------------------------------------------------
PG_BINDIR=""
find_bindir() {
    local d
    # Highest version wins (version-sort on the <ver> path component).
    PG_BINDIR="$(for d in /usr/lib/postgresql/*/bin; do
        if [[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/pgbench" ]]; then
            echo "$d"
        fi
    done | sort -V | tail -n1)"
}

# Resolve one tool: $PG_BINDIR/<tool>, else PATH. Prints nothing if absent.
tool() {
    if [[ -n "$PG_BINDIR" && -x "$PG_BINDIR/$1" ]]; then
        echo "$PG_BINDIR/$1"
    else
        command -v "$1" 2>/dev/null || true
    fi
}

have_all_tools() {
    local t
    for t in initdb pg_ctl postgres pgbench psql pg_isready; do
        [[ -n "$(tool "$t")" ]] || return 1
    done
}

install_postgres() {
    local -a priv=()
    if ((!IS_ROOT)); then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            priv=(sudo -n)
        else
            die "PostgreSQL binaries (initdb, pgbench, ...) not found and not root. Install them first: apt-get install -y --no-install-recommends postgresql postgresql-contrib"
        fi
    fi
    log "installing PostgreSQL from Debian (postgresql postgresql-contrib)"
    "${priv[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${priv[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends postgresql postgresql-contrib
}

find_bindir
if ! have_all_tools; then
    install_postgres
    find_bindir
    have_all_tools || die "PostgreSQL tools still missing after install"
fi
INITDB="$(tool initdb)"
PG_CTL="$(tool pg_ctl)"
POSTGRES="$(tool postgres)"
PGBENCH="$(tool pgbench)"
PSQL="$(tool psql)"
PG_ISREADY="$(tool pg_isready)"
log "using PostgreSQL binaries from ${PG_BINDIR:-PATH ($(dirname "$INITDB"))}"

# ---------------------------------------------------------------------------
# Unprivileged user to run the cluster as (only needed when root).
# ---------------------------------------------------------------------------
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
    log "running PostgreSQL as user $RUN_USER"
fi

# Run a command as the cluster's owner.
as_pg() {
    if ((IS_ROOT)); then
        if command -v runuser >/dev/null 2>&1; then
            runuser -u "$RUN_USER" -- "$@"
        else
            su -s /bin/sh "$RUN_USER" -c "$(printf '%q ' "$@")"
        fi
    else
        "$@"
    fi
}

# ---------------------------------------------------------------------------
# Throw-away cluster directory + cleanup on every exit path.
# ---------------------------------------------------------------------------
PARENT="${PG_BENCH_TMPDIR:-/var/tmp}"
[[ -d "$PARENT" && -w "$PARENT" ]] || PARENT="${TMPDIR:-/tmp}"
WORK="$(mktemp -d "$PARENT/pg-nextval.XXXXXX")"
# Unix socket paths are limited to ~107 bytes.
if ((${#WORK} > 80)); then
    rmdir "$WORK"
    WORK="$(mktemp -d /tmp/pg-nextval.XXXXXX)"
fi
DATA="$WORK/data"
SERVER_LOG="$WORK/server.log"
STARTED=0

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if ((STARTED)); then
        if ! as_pg "$PG_CTL" -D "$DATA" -m fast -w -t 20 stop >/dev/null 2>&1; then
            # Still up after 20 s: kill the postmaster this script started.
            local pid
            pid="$(head -n1 "$DATA/postmaster.pid" 2>/dev/null || true)"
            if [[ "$pid" =~ ^[0-9]+$ ]]; then
                log "pg_ctl stop failed; killing postmaster $pid"
                kill -9 "$pid" 2>/dev/null || true
                sleep 1
            fi
        fi
    fi
    rm -rf -- "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ((IS_ROOT)); then
    chown "$RUN_USER" "$WORK"
fi
chmod 700 "$WORK"
# The cluster owner may not be able to read the caller's cwd.
cd "$WORK"

FSTYPE="$(stat -f -c %T "$WORK" 2>/dev/null || echo unknown)"
if [[ "$FSTYPE" == tmpfs || "$FSTYPE" == ramfs ]]; then
    log "warning: $WORK is on $FSTYPE: fsync is free there, figures are not durable-disk figures (set PG_BENCH_TMPDIR)"
fi

# ---------------------------------------------------------------------------
# initdb + start on 127.0.0.1:<free port>.
# ---------------------------------------------------------------------------
log "initdb into $DATA ($FSTYPE)"
if ! as_pg "$INITDB" -D "$DATA" -U "$PGSUPER" -A trust -E UTF8 --no-locale \
    >"$WORK/initdb.log" 2>&1; then
    cat "$WORK/initdb.log" >&2
    die "initdb failed"
fi

cat >>"$DATA/postgresql.conf" <<EOF

# --- pg-nextval-bench.sh ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
max_connections = $MAX_CONN
# Durable commits (PostgreSQL's defaults, stated explicitly): a commit that
# wrote WAL waits for the WAL fsync — comparable to idgen's strict mode.
fsync = on
synchronous_commit = on
EOF

pick_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
        return
    fi
    local p i
    for ((i = 0; i < 50; i++)); do
        p=$((20000 + RANDOM % 40000))
        # Free if nothing accepts a connection there.
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    die "no free port found"
}

PORT=""
for attempt in 1 2 3; do
    PORT="$(pick_port)"
    log "starting server on 127.0.0.1:$PORT (attempt $attempt)"
    STARTED=1
    if as_pg "$PG_CTL" -D "$DATA" -l "$SERVER_LOG" -o "-p $PORT" -w -t 30 start >/dev/null; then
        break
    fi
    as_pg "$PG_CTL" -D "$DATA" -m immediate -w -t 10 stop >/dev/null 2>&1 || true
    STARTED=0
    PORT=""
    tail -n 20 "$SERVER_LOG" >&2 || true
done
[[ -n "$PORT" ]] || die "could not start PostgreSQL (log above)"

# Bounded wait for readiness (pg_ctl -w already waited; belt and braces).
ready=0
for ((i = 0; i < 30; i++)); do
    if as_pg "$PG_ISREADY" -q -h 127.0.0.1 -p "$PORT" -t 1; then
        ready=1
        break
    fi
    sleep 1
done
((ready)) || die "server not ready after 30 s"

psql_do() { as_pg "$PSQL" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U "$PGSUPER" "$@"; }
psql_val() { psql_do -At "$@"; }

psql_do -d postgres -c "CREATE DATABASE $DB"
psql_do -d "$DB" -c "CREATE SEQUENCE bench_seq"
psql_do -d "$DB" -c "CREATE TABLE counters (k int PRIMARY KEY, v bigint NOT NULL); INSERT INTO counters VALUES (1, 0)"
UPDATE_SCRIPT="$WORK/update.sql"
printf '%s\n' '\set k 1' 'UPDATE counters SET v = v + 1 WHERE k = :k RETURNING v;' >"$UPDATE_SCRIPT"
((IS_ROOT)) && chown "$RUN_USER" "$UPDATE_SCRIPT"

SCRIPT="$WORK/nextval.sql"
printf '%s\n' "SELECT nextval('bench_seq');" >"$SCRIPT"
((IS_ROOT)) && chown "$RUN_USER" "$SCRIPT"

SERVER_VERSION="$(psql_val -d "$DB" -c 'SHOW server_version')"
FSYNC="$(psql_val -d "$DB" -c 'SHOW fsync')"
SYNC_COMMIT="$(psql_val -d "$DB" -c 'SHOW synchronous_commit')"
WAL_BEFORE="$(psql_val -d "$DB" -c 'SELECT pg_current_wal_lsn()')"
# WAL fsync count (pg_stat_wal.wal_sync exists in PostgreSQL 14-17 only;
# best effort, cumulative stats may lag by about a second).
wal_syncs() { psql_val -d "$DB" -c 'SELECT wal_sync FROM pg_stat_wal' 2>/dev/null || true; }
SYNC_BEFORE="$(wal_syncs)"

# ---------------------------------------------------------------------------
# The benchmark. -M prepared: fair best case (no parse/plan per call).
# ---------------------------------------------------------------------------
log "pgbench: $CLIENTS clients, $THREADS threads, ${DURATION}s, SELECT nextval('bench_seq')"
as_pg "$PGBENCH" -n -M prepared -c "$CLIENTS" -j "$THREADS" -T "$DURATION" \
    -f "$SCRIPT" -h 127.0.0.1 -p "$PORT" -U "$PGSUPER" "$DB" \
    >"$WORK/pgbench.out" 2>&1 || {
    cat "$WORK/pgbench.out" >&2
    die "pgbench failed"
}
cat "$WORK/pgbench.out"

WAL_BYTES="$(psql_val -d "$DB" -c "SELECT pg_current_wal_lsn() - '$WAL_BEFORE'::pg_lsn")"
SYNC_AFTER="$(wal_syncs)"
SEQ_STATE="$(psql_val -d "$DB" -c 'SELECT last_value, log_cnt FROM bench_seq' | tr '|' ' ')"

# PostgreSQL 14+: "tps = N (without initial connection time)";
# older: "tps = N (excluding connections establishing)".
TPS="$(awk '/^tps = / && /\((without initial connection time|excluding connections establishing)\)/ { print $3; exit }' \
    "$WORK/pgbench.out")"
[[ -n "$TPS" ]] || TPS="$(awk '/^tps = / { print $3; exit }' "$WORK/pgbench.out")"
[[ "$TPS" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "could not parse tps from pgbench output"
TXNS="$(awk '/^number of transactions actually processed:/ { split($6, a, "/"); print a[1]; exit }' "$WORK/pgbench.out")"

echo "info: postgres=$("$POSTGRES" --version | sed 's/^postgres //') server_version=$SERVER_VERSION"
echo "info: nproc=$(nproc) clients=$CLIENTS threads=$THREADS seconds=$DURATION fs=$FSTYPE fsync=$FSYNC synchronous_commit=$SYNC_COMMIT"
if [[ -n "$TXNS" && "$TXNS" -gt 0 ]]; then
    echo "info: wal_bytes=$WAL_BYTES transactions=$TXNS wal_bytes_per_txn=$(awk -v b="$WAL_BYTES" -v t="$TXNS" 'BEGIN { printf "%.2f", b / t }') bench_seq(last_value log_cnt)=($SEQ_STATE)"
    if [[ "$SYNC_BEFORE" =~ ^[0-9]+$ && "$SYNC_AFTER" =~ ^[0-9]+$ ]]; then
        echo "info: wal_fsyncs~=$((SYNC_AFTER - SYNC_BEFORE)) txns_per_wal_fsync~=$(awk -v s="$((SYNC_AFTER - SYNC_BEFORE))" -v t="$TXNS" 'BEGIN { if (s > 0) printf "%.1f", t / s; else print "inf" }')"
    fi
fi

# ---------------------------------------------------------------------------
# The durable-per-call peer: UPDATE ... RETURNING on one row.
# ---------------------------------------------------------------------------
log "pgbench: $CLIENTS clients, $THREADS threads, ${DURATION}s, UPDATE counters SET v = v + 1 WHERE k = :k RETURNING v"
as_pg "$PGBENCH" -n -M prepared -c "$CLIENTS" -j "$THREADS" -T "$DURATION" \
    -f "$UPDATE_SCRIPT" -h 127.0.0.1 -p "$PORT" -U "$PGSUPER" "$DB" \
    >"$WORK/pgbench-update.out" 2>&1 || {
    cat "$WORK/pgbench-update.out" >&2
    die "pgbench (UPDATE ... RETURNING) failed"
}
cat "$WORK/pgbench-update.out"
UPDATE_TPS="$(awk '/^tps = / && /\((without initial connection time|excluding connections establishing)\)/ { print $3; exit }' \
    "$WORK/pgbench-update.out")"
[[ -n "$UPDATE_TPS" ]] || UPDATE_TPS="$(awk '/^tps = / { print $3; exit }' "$WORK/pgbench-update.out")"
[[ "$UPDATE_TPS" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "could not parse tps from the UPDATE pgbench output"
echo "info: counters.v=$(psql_val -d "$DB" -c 'SELECT v FROM counters WHERE k = 1') (one per committed UPDATE)"
echo "pg_update_tps=$UPDATE_TPS"
echo "pg_nextval_tps=$TPS"
