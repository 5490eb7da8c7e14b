#!/usr/bin/env bash
# The whole test suite: unit tests, integration tests against a real server
# on 127.0.0.1:0, and tests of the real binary (kill -9, SIGTERM, start-up
# refusals). Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test
