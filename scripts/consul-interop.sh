#!/usr/bin/env bash
# Wire-compatibility check of the in-repo Consul test server against a real
# Consul client: PyPI's py-consul.
#
# Builds the consul-testserver binary, installs py-consul into a virtualenv
# under ${TMPDIR:-/tmp}/idgen-consul-venv, starts the server on 127.0.0.1:0,
# runs scripts/consul_interop.py against it, then runs
# py-consul's own upstream tests for the APIs idgen uses, each on a fresh
# server (scripts/py-consul-upstream.sh).
# Prints one line per check and "N passed, 0 failed"; exits non-zero on any
# failure. Honours CARGO_TARGET_DIR and CARGO_BUILD_JOBS.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
manifest=consul/testserver/Cargo.toml
py_consul_version=${PY_CONSUL_VERSION:-1.8.0}
venv="${TMPDIR:-/tmp}/idgen-consul-venv"

echo "== building consul-testserver"
cargo build --quiet --manifest-path "$manifest" --bin consul-testserver
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$manifest" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
server_bin="$target_dir/debug/consul-testserver"

echo "== preparing $venv (py-consul $py_consul_version)"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('py-consul') != '$py_consul_version')" 2>/dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "py-consul==$py_consul_version"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/consul-interop.XXXXXX")
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

"$server_bin" --listen 127.0.0.1:0 >"$work/stdout" 2>"$work/stderr" &
server_pid=$!

addr=""
for _ in $(seq 1 100); do
    line=$(head -n 1 "$work/stdout" 2>/dev/null || true)
    case "$line" in
        "listening on "*) addr=${line#listening on }; break ;;
    esac
    if ! kill -0 "$server_pid" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
if [ -z "$addr" ]; then
    echo "consul-testserver did not start:" >&2
    cat "$work/stderr" >&2
    exit 1
fi
echo "== consul-testserver listening on $addr"

"$venv/bin/python" scripts/consul_interop.py "$addr"

# py-consul's own tests for the APIs idgen uses, fetched from PyPI at run
# time (they start their own servers).
bash scripts/py-consul-upstream.sh "$server_bin" "$venv"
