#!/usr/bin/env bash
# Runs every test of the crate: unit, integration and doc tests, then the
# provider tests against real protocol peers (started here, stopped on exit).
# `.ci/run` calls this same script.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --all-features

if [ -f scripts/peers/start.sh ]; then
  trap 'bash scripts/peers/stop.sh' EXIT
  bash scripts/peers/start.sh
  set -a
  # shellcheck disable=SC1091
  . .peers/env
  set +a
  # The peer tests are #[ignore]d so that a plain `cargo test` skips them
  # visibly; here the peers are up, so run them.
  cargo test --all-features --test 'provider_*' -- --ignored
fi
