#!/usr/bin/env bash
# Starts the peers, runs the tests that need them (the #[ignore]d provider
# tests), runs the quickstart against the real llama.cpp server, and stops
# the peers whatever happens. Extra arguments go to the test binaries, e.g.
#   bash scripts/peers/run-tests.sh --nocapture
#
# A peer that cannot start fails the run, with the reason. Only
# TOWER_AGENT_NO_LLAMA=1, or TOWER_AGENT_NO_PYTHON=1 (a machine without
# python3; it implies the other), leaves llama.cpp out, and then the run's
# last line names what did not run (also recorded in .peers/not-run, for
# scripts/test.sh and .ci/run to say last).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

NOT_RUN=""
if [[ "${TOWER_AGENT_NO_PYTHON:-0}" == "1" ]]; then
  NOT_RUN="tests/provider_llama.rs and the quickstart against llama.cpp (TOWER_AGENT_NO_PYTHON=1)"
elif [[ "${TOWER_AGENT_NO_LLAMA:-0}" == "1" ]]; then
  NOT_RUN="tests/provider_llama.rs and the quickstart against llama.cpp (TOWER_AGENT_NO_LLAMA=1)"
fi
[[ -z "$NOT_RUN" ]] || bash "$ROOT/scripts/peers/not-run.sh" add "$NOT_RUN"
finish() {
  local status=$?
  bash "$ROOT/scripts/peers/stop.sh"
  if [[ -n "$NOT_RUN" ]]; then
    printf '[peers] NOT RUN: %s\n' "$NOT_RUN"
  fi
  exit "$status"
}
trap finish EXIT

step() { printf '\n[peers] ==> %s\n' "$*" >&2; }

step "starting the peers"
bash scripts/peers/start.sh
set -a
# shellcheck disable=SC1091
source .peers/env
set +a

suites=(--test provider_openai_mock --test provider_anthropic --test chaos)
[[ -z "$NOT_RUN" ]] && suites+=(--test provider_llama)
step "provider tests against the peers: ${suites[*]}"
cargo test --all-features "${suites[@]}" -- --ignored "$@"

if [[ -z "$NOT_RUN" ]]; then
  step "the quickstart against llama.cpp at $LLAMA_URL"
  out="$(mktemp)"
  OPENAI_BASE_URL="$LLAMA_URL" OPENAI_MODEL=smollm2 OPENAI_API_KEY="" \
    cargo run --quiet --all-features --example quickstart | tee "$out"
  grep -q '^Usage, one line per model call' "$out" \
    || { rm -f "$out"; echo "[peers] the quickstart printed no usage" >&2; exit 1; }
  grep -Eq '^  support +smollm2 +in +[1-9][0-9]* +out +[1-9]' "$out" \
    || { rm -f "$out"; echo "[peers] the quickstart's usage has no line for a llama.cpp call" >&2; exit 1; }
  rm -f "$out"
fi
