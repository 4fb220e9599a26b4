#!/usr/bin/env bash
# Runs every test of the crate: unit, integration and doc tests, then the
# provider tests against real protocol peers (aimock, and llama.cpp where the
# CPU can run it), which scripts/peers/run-tests.sh installs, starts and
# stops. `.ci/run` calls this same script.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --all-features
bash scripts/peers/run-tests.sh
