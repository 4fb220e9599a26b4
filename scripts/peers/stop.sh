#!/usr/bin/env bash
# Stops the peers scripts/peers/start.sh started, by the PIDs it recorded in
# .peers/*.pid (only while each is still the process it started), and
# removes .peers/env. Safe to run when nothing runs.
#   --quiet   say nothing when there is nothing to stop
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS="$ROOT/.peers"
QUIET=0
[[ "${1:-}" == "--quiet" ]] && QUIET=1

log() { (( QUIET )) || printf '[peers] %s\n' "$*" >&2; }

# Stops pid $2 (peer $1) if it is still the process we started: its command
# line must mention $3.
stop_one() {
  local name="$1" pidfile="$PEERS/$1.pid" expect="$2" pid
  [[ -f "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  rm -f "$pidfile"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if ! kill -0 "$pid" 2>/dev/null; then
    log "$name (pid $pid) was not running"
    return 0
  fi
  if ! tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$expect"; then
    log "pid $pid is no longer $name; leaving it alone"
    return 0
  fi
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || { log "stopped $name (pid $pid)"; return 0; }
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null
  log "killed $name (pid $pid) after 10 s"
}

[[ -d "$PEERS" ]] || exit 0
stop_one aimock "llmock"
stop_one llama "llama_server.py"
rm -f "$PEERS/env" "$PEERS/env.tmp"
exit 0
