#!/usr/bin/env bash
# The npm package as a user gets it: packs clients/typescript (`npm pack`,
# which builds it from proto/ and src/), installs the tarball into a
# scratch project DIR (its own package.json, dependencies from the npm
# cache or registry), and with --test runs the package's tests
# (clients/typescript/tests) there, against the installed package, not the
# source tree. The conformance driver is then
#   node DIR/node_modules/@idgen/client/dist/conformance.js
#
#   clients/typescript/scripts/packaged.sh DIR [--test]
#
# The tests need the idgen and consul-testserver binaries: $IDGEN_BIN and
# $CONSUL_TESTSERVER, by default target/debug/idgen and
# target/debug/consul-testserver (cargo build --bin idgen --bin consul-testserver).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir=${1:?usage: packaged.sh DIR [--test]}
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

# Dev dependencies (typescript, @types/node) at the versions
# package-lock.json pins; skipped when they are installed already.
if ! cmp -s "$here/package-lock.json" "$here/node_modules/.package-lock.json.copy" 2>/dev/null; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$here/package-lock.json" "$here/node_modules/.package-lock.json.copy"
fi
rm -f "$dir"/idgen-client-*.tgz
tarball=$(cd "$here" && npm pack --silent --pack-destination "$dir" | tail -n1)
cd "$dir"
rm -rf node_modules package.json package-lock.json tests
echo '{ "name": "idgen-client-scratch", "private": true }' > package.json
npm install --no-audit --no-fund --prefer-offline --loglevel=error "./$tarball"
echo "packaged: $tarball installed into $dir"

if [ "${2:-}" = "--test" ]; then
  cp -r "$here/tests" "$dir/tests"
  export IDGEN_BIN="${IDGEN_BIN:-$repo/target/debug/idgen}"
  export CONSUL_TESTSERVER="${CONSUL_TESTSERVER:-$repo/target/debug/consul-testserver}"
  # The types as a user's TypeScript sees them (ESM and CommonJS).
  "$here/node_modules/.bin/tsc" -p tests/typecheck --typeRoots "$here/node_modules/@types"
  echo "packaged: the installed package's types compile (tests/typecheck)"
  node --test tests/
fi
