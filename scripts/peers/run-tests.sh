#!/usr/bin/env bash
# Starts the peers, runs the tests that need them (the #[ignore]d provider
# tests), says loudly when the llama.cpp tests were skipped, and stops the
# peers whatever happens. Extra arguments go to the test binaries, e.g.
#   bash scripts/peers/run-tests.sh --nocapture
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
trap 'bash "$ROOT/scripts/peers/stop.sh"' EXIT

bash scripts/peers/start.sh
set -a
# shellcheck disable=SC1091
source .peers/env
set +a

cargo test --all-features \
  --test provider_openai_mock --test provider_anthropic --test provider_llama \
  -- --ignored "$@"

if [[ -n "${LLAMA_SKIP_REASON:-}" ]]; then
  printf '\n[peers] SKIPPED: the llama.cpp tests (tests/provider_llama.rs) tested nothing: %s\n\n' \
    "$LLAMA_SKIP_REASON" >&2
fi
