#!/usr/bin/env bash
# Runs every test of the crate: unit, integration and doc tests, then the
# tests against real peers, each script installing, starting and stopping its
# own: the MCP servers, the `openai` Python client and Chromium
# (run-edge-tests.sh), redis-server (run-redis-tests.sh), then aimock and llama.cpp with the quickstart against
# llama.cpp (run-tests.sh). A peer that cannot start fails the run. Only two
# opt-outs leave suites out, and the last line then names them (each peer
# script records what it left out in .peers/not-run, cleared here first):
#   TOWER_AGENT_NO_LLAMA=1    llama.cpp and the quickstart against it
#   TOWER_AGENT_NO_PYTHON=1   a machine without python3: the llama.cpp ones
#                             and the `openai` Python client suite
#                             (tests/serve_openai_client.rs)
# `.ci/run` calls this same script, and says the same last.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/peers/not-run.sh clear
trap 'bash scripts/peers/not-run.sh line' EXIT

cargo test --all-features
bash scripts/peers/run-edge-tests.sh
bash scripts/peers/run-redis-tests.sh
bash scripts/peers/run-tests.sh
