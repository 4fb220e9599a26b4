#!/usr/bin/env bash
# The peer benchmark: the same workload in this crate and in LangChain v1,
# the OpenAI Agents SDK and Pydantic AI, each at a pinned version, and one
# table of the results. Not part of CI; docs/peer-bench.md has the latest
# table and the machine it ran on.
#
#   bash scripts/bench-peers.sh            # prints the table (Markdown)
#   bash scripts/bench-peers.sh --json     # prints each peer's JSON line
#
# The workload (scripts/bench_peers/common.py, examples/bench_peers.rs): a
# 3-turn run (model → tool → model → tool → model) on an in-process fake
# model, no network, native async everywhere (tokio's current-thread
# runtime; one asyncio loop), with 0 and with 8 no-op middleware of each
# framework's own kind, then 1,000 runs at once on a model that answers
# after 50 ms for memory per run and wall time.
#
# The Python peers go into a venv in $TOWER_AGENT_CACHE/bench-peers (default
# ~/.cache/tower-agent/bench-peers), made once and reused. Needs Python 3.10+
# with venv and pip, and Linux (memory is read from /proc/self/status).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${TOWER_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tower-agent}/bench-peers"
VENV="$CACHE/venv"
PINS=(
  "langchain==1.5.0"
  "langchain-core==1.8.1"
  "langgraph==1.2.22"
  "openai-agents==0.24.0"
  "pydantic-ai-slim==2.68.0"
)
PEERS=(langchain_peer openai_agents_peer pydantic_ai_peer)

log() { printf '[bench-peers] %s\n' "$*" >&2; }

JSON=0
[[ "${1:-}" == "--json" ]] && JSON=1

[[ -r /proc/self/status ]] || { log "needs Linux: memory is read from /proc/self/status"; exit 1; }
command -v python3 >/dev/null || { log "python3 is required"; exit 1; }

mkdir -p "$CACHE"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating the venv $VENV"
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" - "${PINS[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  log "installing ${PINS[*]} into $VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --cache-dir "$CACHE/pip-cache" "${PINS[@]}" >&2
fi

cd "$ROOT"
log "building examples/bench_peers.rs (release)"
# The executable is where cargo says it built it (CARGO_TARGET_DIR, a
# configured target-dir or ./target), read from its JSON messages.
BENCH="$(cargo build --quiet --release --example bench_peers --message-format=json-render-diagnostics \
  | "$VENV/bin/python" -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "bench_peers" and msg.get("executable"):
        print(msg["executable"])
')"
[[ -n "$BENCH" && -x "$BENCH" ]] || { log "cargo named no bench_peers executable"; exit 1; }

results="$(mktemp)"
trap 'rm -f "$results"' EXIT
log "tower-agent ($BENCH)"
"$BENCH" >> "$results"
for peer in "${PEERS[@]}"; do
  log "$peer"
  "$VENV/bin/python" "$ROOT/scripts/bench_peers/$peer.py" >> "$results"
done

if (( JSON )); then
  cat "$results"
else
  "$VENV/bin/python" "$ROOT/scripts/bench_peers/table.py" < "$results"
fi
