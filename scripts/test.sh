#!/usr/bin/env bash
# The whole test suite: unit tests, doc examples, integration tests against
# a real server on 127.0.0.1:0, tests of the real binary (kill -9, SIGTERM,
# start-up refusals), the Consul client and leases against the in-repo
# Consul test server, and that server against a real third-party Consul
# client (PyPI py-consul, and py-consul's own upstream tests for the APIs
# idgen uses, fetched from PyPI), the deployment files (promtool check
# and unit tests of the alert rules, systemd-analyze verify, Kubernetes
# manifests validated offline; scripts/check-deploy.sh), the client crate
# against real nodes, every client's conformance driver (clients/conformance),
# the Python client as installed (on Python 3.11 and 3.9), the npm package
# (clients/typescript, packed and installed), the admin console in
# headless Chromium (tests/console.rs), the Prometheus scrape config
# through Consul, and every shell block of the docs against real processes
# (tests/doc_commands.rs, docs/CONTRIBUTING.md). Installs what it needs
# first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/consul-interop.sh
bash scripts/check-deploy.sh
"${TMPDIR:-/tmp}/idgen-py-venv/bin/python" scripts/check_prometheus_config.py consul/prometheus.yml
status=0
# The npm package as a user installs it: packed, installed into a scratch
# project, its tests (node --test) run there against three nodes on the
# Consul test server (consul-interop.sh built it). 30 s on a quiet
# machine, 85 s at load average 30.
cargo build --quiet --bin idgen
IDGEN_BIN="$PWD/target/debug/idgen" CONSUL_TESTSERVER="$PWD/target/debug/consul-testserver" \
  bash clients/typescript/scripts/packaged.sh "${TMPDIR:-/tmp}/idgen-ts-client" --test || status=$?
# The Python client's suite runs installed, against real nodes (tests/client_python.rs).
export REQUIRE_PYTHON_EXAMPLE=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --no-fail-fast 2>&1 | tee "$log" || status=$?
# One closing line for the whole cargo run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
# The client conformance suite (docs/CONFORMANCE.md): every driver listed in
# clients/conformance/drivers.json, built, against fresh 3-node fixtures; a
# listed driver that cannot be built fails here (about 25 s per language).
# The idgen binary is cargo test's build, consul-testserver consul-interop.sh's.
bin_dir="${CARGO_TARGET_DIR:-target}/debug"
# The Python client's wheel on Python 3.9, the oldest it accepts: its suite
# and its conformance driver there (scripts/python39.sh; about a minute).
bash scripts/python39.sh test "$bin_dir/idgen" "$bin_dir/consul-testserver" || status=$?
python3 clients/conformance/run.py --idgen "$bin_dir/idgen" \
  --consul-testserver "$bin_dir/consul-testserver" --registry || status=$?
exit "$status"
