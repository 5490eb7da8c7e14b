#!/usr/bin/env bash
# The Python client as a user installs it: builds the wheel of
# clients/python (pip fetches its build backend and grpcio-tools from
# PyPI; the stubs are generated from proto/ during the build) and installs
# it, with prometheus_client, into a fresh virtualenv
# ${TMPDIR:-/tmp}/idgen-client-venv, and keeps the wheel in its dist/
# (scripts/python39.sh installs that same file on Python 3.9). Does
# nothing when that virtualenv was made from the same clients/python and
# proto (a stamp of their content).
# Called by scripts/setup.sh and by the conformance registry
# (clients/conformance/drivers.json).
set -euo pipefail
repo_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
client_venv="${TMPDIR:-/tmp}/idgen-client-venv"
stamp=$(cd "$repo_dir" && find clients/python proto/idgen -type f \
  -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
if [ "$(cat "$client_venv/.idgen-stamp" 2>/dev/null)" = "$stamp" ] &&
  ls "$client_venv"/dist/idgen_client-*.whl >/dev/null 2>&1; then
  exit 0
fi
echo "python-client-venv: building the wheel and installing it into $client_venv"
wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
python3 -m venv "$wheel_dir/build-venv"
"$wheel_dir/build-venv/bin/pip" wheel --quiet --disable-pip-version-check --no-deps \
  -w "$wheel_dir" "$repo_dir/clients/python"
rm -rf "$client_venv"
python3 -m venv "$client_venv"
"$client_venv/bin/pip" install --quiet --disable-pip-version-check \
  "$(ls "$wheel_dir"/idgen_client-*.whl)[prometheus]"
mkdir "$client_venv/dist"
cp "$wheel_dir"/idgen_client-*.whl "$client_venv/dist/"
echo "$stamp" > "$client_venv/.idgen-stamp"
