#!/usr/bin/env bash
# The Python client on the oldest Python it accepts (Requires-Python >=3.9,
# docs/CLIENT-PYTHON.md), so both ends of its range are tested: the
# 3.11 virtualenv of scripts/python-client-venv.sh gets the newest grpcio
# and protobuf, this one what pip picks on 3.9: grpcio 1.78.2, the floor
# (1.80, the only newer grpcio built for 3.9, is excluded there), and the
# newest protobuf built for 3.9.
#
#   python39.sh install   (scripts/setup.sh, as root) installs Debian 11's
#       python3.9 on this Debian 12 machine: Debian 12 ships no 3.9, and
#       bullseye's package is the only 3.9 build this machine can fetch.
#       Adds the bullseye suite of deb.debian.org at apt priority 100 (a
#       package is taken from it only when no other suite has one: only
#       python3.9 and its libraries, libssl1.1, libffi7, libmpdec3), then
#       apt-get update and install, refusing any removal or downgrade.
#       Does nothing when the interpreter is there already.
#   python39.sh test IDGEN CONSUL_TESTSERVER   (scripts/test.sh) installs
#       the wheel python-client-venv.sh built (the same file the 3.11 suite
#       tests) into a fresh 3.9 virtualenv, where pip resolves grpcio and protobuf
#       for 3.9 from PyPI, then runs the package's own suite there (unit
#       tests, and the cluster tests against this build's binaries) and the
#       conformance driver under that interpreter (clients/conformance).
#       About a minute: 10 s of venv and pip, 18 s of suite, 40 s of
#       conformance scenarios. IDGEN and CONSUL_TESTSERVER: the binaries.
#
# IDGEN_PYTHON39 names another 3.9 interpreter (default /usr/bin/python3.9).
set -euo pipefail
repo_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python39="${IDGEN_PYTHON39:-/usr/bin/python3.9}"

is_39() {
  "$python39" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 9))' 2>/dev/null
}

install() {
  if is_39; then
    return 0
  fi
  if [ -n "${IDGEN_PYTHON39:-}" ]; then
    echo "python39: IDGEN_PYTHON39=$python39 is not a Python 3.9 interpreter" >&2
    exit 1
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  echo "python39: installing python3.9 from Debian 11 (bullseye)"
  printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" "Suites: bullseye" \
    "Components: main" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" |
    $sudo tee /etc/apt/sources.list.d/idgen-bullseye.sources >/dev/null
  printf '%s\n' "Package: *" "Pin: release n=bullseye" "Pin-Priority: 100" |
    $sudo tee /etc/apt/preferences.d/idgen-bullseye >/dev/null
  $sudo apt-get update -qq
  if ! apt-cache policy python3.9 | grep -q 'bullseye/main'; then
    echo "python39: apt-get update could not fetch bullseye from http://deb.debian.org/debian," \
      "so there is no python3.9 to install: reach that mirror (or set IDGEN_PYTHON39 to a" \
      "Python 3.9 interpreter) and run scripts/setup.sh again" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    --no-remove python3.9
  if ! is_39; then
    echo "python39: $python39 is not a working Python 3.9 after apt-get install python3.9" >&2
    exit 1
  fi
}

run_tests() {
  if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: python39.sh test IDGEN_BINARY CONSUL_TESTSERVER_BINARY" >&2
    exit 2
  fi
  local idgen testserver
  idgen=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  testserver=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
  if ! is_39; then
    echo "python39: no Python 3.9 at $python39: run scripts/setup.sh (python39.sh install)" >&2
    exit 1
  fi
  # The wheel is built once, by python-client-venv.sh (a no-op when its
  # virtualenv is current), which keeps it beside that virtualenv.
  bash "$repo_dir/scripts/python-client-venv.sh"
  local client_venv="${TMPDIR:-/tmp}/idgen-client-venv"
  local venv="${TMPDIR:-/tmp}/idgen-client-venv39"
  local wheel pip_wheel status=0
  wheel=$(ls "$client_venv"/dist/idgen_client-*.whl)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  rm -rf "$venv"
  # Debian 11's python3.9-venv would replace Debian 12's pip and distutils
  # packages, so the venv starts without pip and gets PyPI's newest pip for
  # 3.9. That pip installs through sysconfig, not distutils (which Debian
  # ships apart): the switch pip documents for distributors.
  "$python39" -m venv --without-pip "$venv"
  echo 'import sysconfig; sysconfig._PIP_USE_SYSCONFIG = True' \
    > "$venv/lib/python3.9/site-packages/_pip_use_sysconfig.pth"
  "$client_venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --python-version 3.9 -d "$work" pip
  pip_wheel=$(ls "$work"/pip-*.whl)
  "$venv/bin/python" "$pip_wheel/pip" install --quiet --disable-pip-version-check \
    --no-index "$pip_wheel"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$wheel[prometheus]"
  "$venv/bin/python" -c 'import sys, grpc, google.protobuf as pb
print("python39: Python %s, grpcio %s, protobuf %s" % (sys.version.split()[0], grpc.__version__, pb.__version__))'
  # From a scratch directory, so `import idgen_client` finds only the
  # installed package, without the caller's CONSUL_* variables (as
  # tests/client_python.rs runs the suite on 3.11).
  (
    cd "$work"
    for v in $(compgen -e | grep '^CONSUL_' || true); do unset "$v"; done
    TEST_IDGEN_BIN="$idgen" TEST_CONSUL_TESTSERVER_BIN="$testserver" \
      GRPC_VERBOSITY=NONE "$venv/bin/python" -m unittest discover -s "$repo_dir/clients/python/tests"
  ) || status=$?
  python3 "$repo_dir/clients/conformance/run.py" --idgen "$idgen" \
    --consul-testserver "$testserver" \
    --driver "python3.9=$venv/bin/python -m idgen_client.conformance" || status=$?
  return "$status"
}

case "${1:-}" in
  install) install ;;
  test) shift && run_tests "$@" ;;
  *)
    echo "usage: $0 install | test IDGEN_BINARY CONSUL_TESTSERVER_BINARY" >&2
    exit 2
    ;;
esac
