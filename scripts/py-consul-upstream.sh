#!/usr/bin/env bash
# Runs py-consul's own upstream tests for the Consul APIs idgen uses against
# consul-testserver. Called by scripts/consul-interop.sh; usable alone:
#
#   scripts/py-consul-upstream.sh <consul-testserver binary> <virtualenv>
#
# The tests are not part of this repository: the py-consul sdist on PyPI
# carries them (tests/ and a conftest.py that starts Consul in Docker). This
# script downloads that sdist with pip, replaces only the root conftest.py
# (the fixture that starts a server) by scripts/py_consul_upstream_conftest.py,
# which starts consul-testserver instead, and runs the selected tests with
# pytest, unchanged. Every selected test must pass.
set -euo pipefail

server_bin=${1:?usage: py-consul-upstream.sh <consul-testserver binary> <virtualenv>}
venv=${2:?usage: py-consul-upstream.sh <consul-testserver binary> <virtualenv>}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=${PY_CONSUL_VERSION:-1.8.0}

# The upstream tests idgen relies on, and why each area is in:
#   KV (get, put, cas, flags, recurse, keys, delete, delete-cas, acquire and
#   release, blocking wait): idgen's marks, segments, lease tokens, strict
#   counters and worker locks.
#   Sessions (create/list/info/node/destroy, ?dc errors, Behavior delete, TTL,
#   renew): the worker session.
#   Txn: every guarded write (check-session + cas, check-index + lock).
#   Health service (passing filter, TTL checks, tags, deregister): discovery.
#   Agent service register/deregister, agent/services, agent/self.
# Left out, because idgen does not use those APIs (and the emulator does not
# implement them): ACL management and agent tokens, agent check register and
# maintenance modes, members/join/leave/force-leave, reload, metrics and
# monitor, HTTP/script/TCP checks (test_agent_checks, test_service_multi_check),
# tagged addresses, service kinds and Connect, health state/node/checks and
# filter expressions, catalog, prepared queries, config entries, coordinates,
# events, operator, snapshot, status. test_health_service_merge_central_config
# passes too but is a config-entry feature.
selected=(
    tests/api/test_kv.py::TestConsul::test_kv
    tests/api/test_kv.py::TestConsul::test_kv_wait
    tests/api/test_kv.py::TestConsul::test_kv_encoding
    tests/api/test_kv.py::TestConsul::test_kv_put_cas
    tests/api/test_kv.py::TestConsul::test_kv_put_flags
    tests/api/test_kv.py::TestConsul::test_kv_recurse
    tests/api/test_kv.py::TestConsul::test_kv_delete
    tests/api/test_kv.py::TestConsul::test_kv_delete_cas
    tests/api/test_kv.py::TestConsul::test_kv_acquire_release
    tests/api/test_kv.py::TestConsul::test_kv_keys_only
    tests/api/test_session.py::TestSession::test_session
    tests/api/test_session.py::TestSession::test_session_delete_ttl_renew
    tests/api/test_txn.py::TestTxn::test_transaction
    tests/api/test_health.py::TestHealth::test_health_service
    tests/api/test_agent.py::TestAgent::test_service_dereg_issue_156
    tests/api/test_agent.py::TestAgent::test_agent_services
    tests/api/test_agent.py::TestAgent::test_agent_self
)

# Pinned, so a new pytest release cannot change what CI runs.
"$venv/bin/pip" install --quiet --disable-pip-version-check "pytest==9.2.0" "packaging==26.3"

work=$(mktemp -d "${TMPDIR:-/tmp}/py-consul-upstream.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "== downloading the py-consul $version sdist (its tests) from PyPI"
"$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    --no-binary :all: --dest "$work" "py-consul==$version"
tar -xzf "$work/py_consul-$version.tar.gz" -C "$work"
src="$work/py_consul-$version"
if [ ! -f "$src/conftest.py" ] || [ ! -d "$src/tests/api" ]; then
    echo "the py-consul $version sdist has no conftest.py or tests/api" >&2
    exit 1
fi
cp "$here/py_consul_upstream_conftest.py" "$src/conftest.py"

echo "== running ${#selected[@]} upstream py-consul tests against consul-testserver"
# addopts is cleared: upstream's asks for pytest-cov, which is not needed here.
cd "$src"
CONSUL_TESTSERVER_BIN="$server_bin" "$venv/bin/python" -m pytest \
    -p no:cacheprovider -o addopts="" -q "${selected[@]}"
