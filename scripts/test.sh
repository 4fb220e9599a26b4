#!/usr/bin/env bash
# Runs every test of the crate: unit, integration and doc tests, then the
# tests against real peers, each script installing, starting and stopping its
# own: the MCP servers, the `openai` Python client and Chromium
# (run-edge-tests.sh), redis-server (run-redis-tests.sh), then aimock and llama.cpp with the quickstart against
# llama.cpp (run-tests.sh, last, so that its last line can say what did not
# run). A peer that cannot start fails the run; only TOWER_AGENT_NO_LLAMA=1
# leaves llama.cpp out, said in the last line.
# `.ci/run` calls this same script.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --all-features
bash scripts/peers/run-edge-tests.sh
bash scripts/peers/run-redis-tests.sh
bash scripts/peers/run-tests.sh
