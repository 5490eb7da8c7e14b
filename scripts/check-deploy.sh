#!/usr/bin/env bash
# Checks every shipped deployment file, offline:
#   - deploy/prometheus: `promtool check rules` and `promtool test rules`
#     (the rules' unit tests);
#   - deploy/systemd: `systemd-analyze verify` (any warning fails) and
#     `systemd-analyze security --offline` (exposure at most 2.0);
#   - deploy/kubernetes: scripts/validate_k8s.py against the Kubernetes API
#     types of the PyPI `kubernetes` client (in a virtualenv under
#     ${TMPDIR:-/tmp}/idgen-k8s-venv), after its self-test proves each check
#     catches a deliberate break.
# The dashboard's and the rules' metric names are checked against live
# nodes by tests/observability.rs (cargo test).
# Exits non-zero on any failure. Honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kubernetes_version=${KUBERNETES_PY_VERSION:-37.0.2}
venv="${TMPDIR:-/tmp}/idgen-k8s-venv"

echo "== building idgen"
cargo build --quiet --bin idgen
target_dir=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
idgen="$target_dir/debug/idgen"

echo "== promtool check rules / test rules"
promtool check rules deploy/prometheus/alerts.yml
promtool test rules deploy/prometheus/alerts_test.yml

echo "== systemd-analyze verify deploy/systemd/idgen.service"
work=$(mktemp -d "${TMPDIR:-/tmp}/check-deploy.XXXXXX")
trap 'rm -rf "$work"' EXIT
# verify checks that ExecStart exists: point it at the binary just built.
sed "s#/usr/local/bin/idgen#$idgen#g" deploy/systemd/idgen.service > "$work/idgen.service"
out=$(systemd-analyze verify "$work/idgen.service" 2>&1) || {
    echo "$out"
    echo "systemd-analyze verify failed" >&2
    exit 1
}
if [ -n "$out" ]; then
    # Unknown keys and bad values are only warnings to systemd: fail on them.
    echo "$out"
    echo "systemd-analyze verify warned" >&2
    exit 1
fi
echo "verify: no warnings"
systemd-analyze security --offline=yes --threshold=20 "$work/idgen.service" | tail -n 1

echo "== Kubernetes manifests (kubernetes $kubernetes_version API types)"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('kubernetes') != '$kubernetes_version')" 2>/dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes==$kubernetes_version" pyyaml
fi
"$venv/bin/python" scripts/validate_k8s.py --self-test "$idgen" deploy/kubernetes/embedded
"$venv/bin/python" scripts/validate_k8s.py "$idgen" deploy/kubernetes/embedded deploy/kubernetes/consul
echo "check-deploy: ok"
