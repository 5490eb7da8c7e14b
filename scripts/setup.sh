#!/usr/bin/env bash
# Installs what idgen's build and tests need on a fresh Debian machine.
# Safe to run more than once. Needs root (or sudo) for apt-get.
#
#   - promtool (Debian package `prometheus`): the metrics test runs
#     `promtool check metrics` against /metrics.
#   - gcc/make for crates with C parts (usually present already).
#   - prlimit (util-linux, usually present): a test runs the node under a
#     low open-descriptor limit.
#   - python3 with venv, for the py-consul interop check (py-consul itself
#     comes from PyPI into a throwaway virtualenv; see consul-interop.sh)
#     and the Kubernetes manifest check (PyPI `kubernetes`, same way; see
#     check-deploy.sh).
#   - systemd-analyze (Debian package `systemd`): check-deploy.sh verifies
#     deploy/systemd/idgen.service. promtool also checks and unit-tests
#     deploy/prometheus/alerts.yml.
#   - chromium (Debian package; /usr/bin/chromium) and node + npm (Debian
#     packages nodejs, npm): tests/console.rs drives the admin console in
#     headless Chromium through playwright-core, which `npm ci` installs
#     into tests/console/node_modules at the version package-lock.json
#     pins (playwright-core never downloads a browser).
#   - a virtualenv ${TMPDIR:-/tmp}/idgen-py-venv with grpcio, grpcio-tools
#     PyYAML and python-ulid from PyPI: the Prometheus config check, and
#     ULID text checked against an independent implementation
#     (tests/uuid.rs).
#   - the Python client as a user installs it: the wheel of clients/python
#     built (its build backend and grpcio-tools from PyPI) and installed
#     with prometheus_client into a fresh virtualenv
#     ${TMPDIR:-/tmp}/idgen-client-venv, remade whenever clients/python or
#     the proto changed (scripts/python-client-venv.sh; for
#     tests/client_python.rs, tests/newcomer.rs and the conformance suite).
#   - Python 3.9 (Debian 11's python3.9; scripts/python39.sh install): the
#     Python client's suite also runs on the oldest Python it accepts.
#   - clients/typescript/node_modules from its package-lock.json (`npm
#     ci`): the npm package's build tools (scripts/test.sh packs it).
#   - protoc with the Go, gRPC-Go and gRPC-Java plugins (Debian packages
#     protobuf-compiler, protoc-gen-go, protoc-gen-go-grpc,
#     protobuf-compiler-grpc-java-plugin; about 7 MB to download, no Go or
#     Java toolchain): tests/doc_commands.rs runs docs/CLIENTS.md's
#     stubs-only block. The build itself needs no protoc: the proto is
#     compiled by protox, in Rust.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v prlimit >/dev/null 2>&1 || need+=(util-linux)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
# The admin console test (tests/console.rs) runs Debian's Chromium.
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# docs/CLIENTS.md's stubs for other languages (tests/doc_commands.rs);
# Debian names the gRPC-Java plugin grpc_java_plugin.
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v protoc-gen-go >/dev/null 2>&1 || need+=(protoc-gen-go)
command -v protoc-gen-go-grpc >/dev/null 2>&1 || need+=(protoc-gen-go-grpc)
command -v grpc_java_plugin >/dev/null 2>&1 || need+=(protobuf-compiler-grpc-java-plugin)
# The Consul interop check runs py-consul in a virtualenv.
python3 -m venv --help >/dev/null 2>&1 || need+=(python3 python3-venv)

if [ "${#need[@]}" -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# Debian 12 has no Python 3.9: bullseye's, for the Python client's floor.
bash "$(dirname "$0")/python39.sh" install

command -v cargo >/dev/null 2>&1 || {
  echo "setup: cargo not found; install a Rust toolchain (rustup) first" >&2
  exit 1
}
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt || true
py_venv="${TMPDIR:-/tmp}/idgen-py-venv"
if [ ! -x "$py_venv/bin/python" ]; then
  python3 -m venv "$py_venv"
fi
if ! "$py_venv/bin/python" -c "import grpc, grpc_tools, yaml, ulid" 2>/dev/null; then
  "$py_venv/bin/pip" install --quiet --disable-pip-version-check grpcio grpcio-tools pyyaml python-ulid
fi

# The Python client, built and installed as a user would (about a minute
# when clients/python or the proto changed, nothing otherwise).
bash "$(dirname "$0")/python-client-venv.sh"

# playwright-core for the console test, at the version package-lock.json
# pins; nothing to do when that version is installed already.
console_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/console"
want=$(node -e 'console.log(require(process.argv[1]).packages["node_modules/playwright-core"].version)' "$console_dir/package-lock.json")
have=$(node -e 'try { console.log(require(process.argv[1]).version) } catch (e) { console.log("none") }' "$console_dir/node_modules/playwright-core/package.json")
if [ "$want" != "$have" ]; then
  echo "setup: npm ci in tests/console (playwright-core $want)"
  (cd "$console_dir" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The TypeScript client's build tools (typescript, @grpc/proto-loader's
# proto-loader-gen-types) at the versions its package-lock.json pins;
# clients/typescript/scripts/packaged.sh makes the same check.
ts_dir="$(cd "$(dirname "$0")/.." && pwd)/clients/typescript"
if ! cmp -s "$ts_dir/package-lock.json" "$ts_dir/node_modules/.package-lock.json.copy" 2>/dev/null; then
  echo "setup: npm ci in clients/typescript"
  (cd "$ts_dir" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$ts_dir/package-lock.json" "$ts_dir/node_modules/.package-lock.json.copy"
fi

echo "setup: ok ($(promtool --version 2>&1 | head -n1))"
