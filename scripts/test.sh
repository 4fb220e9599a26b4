#!/usr/bin/env bash
# Runs every test of the crate: unit, integration and doc tests, then the
# provider tests against real protocol peers (aimock and llama.cpp) and the
# quickstart against llama.cpp, which scripts/peers/run-tests.sh installs,
# starts and stops. A peer that cannot start fails the run; only
# TOWER_AGENT_NO_LLAMA=1 leaves llama.cpp out, said in the last line.
# `.ci/run` calls this same script.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --all-features
bash scripts/peers/run-tests.sh
