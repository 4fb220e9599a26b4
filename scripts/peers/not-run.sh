#!/usr/bin/env bash
# What a run of the tests left out, so that the last line of the run says so
# even when more steps follow the peer scripts (`.ci/run`). The peer scripts
# add a line to .peers/not-run for each suite an opt-out variable left out
# (TOWER_AGENT_NO_LLAMA=1, TOWER_AGENT_NO_PYTHON=1); scripts/test.sh and
# `.ci/run` clear it when they start, so a line of an earlier run is never
# printed, and print it as their last line.
#
#   not-run.sh clear        forget what an earlier run left out
#   not-run.sh add WHAT     record that WHAT did not run
#   not-run.sh line         print "[peers] NOT RUN: WHAT; WHAT" (nothing
#                           when everything ran)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
FILE="$ROOT/.peers/not-run"

case "${1:-}" in
  clear)
    rm -f "$FILE"
    ;;
  add)
    [[ -n "${2:-}" ]] || { echo "not-run.sh add: what did not run?" >&2; exit 2; }
    mkdir -p "$(dirname "$FILE")"
    printf '%s\n' "$2" >> "$FILE"
    ;;
  line)
    [[ -s "$FILE" ]] || exit 0
    mapfile -t items < "$FILE"
    printf -v joined '%s; ' "${items[@]}"
    printf '[peers] NOT RUN: %s\n' "${joined%; }"
    ;;
  *)
    echo "usage: not-run.sh clear | add WHAT | line" >&2
    exit 2
    ;;
esac
