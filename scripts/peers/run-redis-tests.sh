#!/usr/bin/env bash
# Runs the Redis-backed store tests against a real redis-server: installs it
# (Debian's package) when missing, starts it on 127.0.0.1 on a free port with
# no persistence in a temporary directory, runs the ignored Redis tests, and
# stops the server on every exit path. Fails, with the reason, when the
# server cannot be installed or started: nothing passes by skipping. Needs
# no Python.
set -euo pipefail

cd "$(dirname "$0")/../.."

if ! command -v redis-server >/dev/null 2>&1; then
    echo "run-redis-tests: installing redis-server" >&2
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "run-redis-tests: redis-server is missing and apt-get is not here to install it" >&2
        exit 1
    fi
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
command -v redis-server >/dev/null || { echo "run-redis-tests: redis-server did not install" >&2; exit 1; }
command -v redis-cli >/dev/null || { echo "run-redis-tests: redis-cli is missing" >&2; exit 1; }

DIR="$(mktemp -d)"
PID=""
cleanup() {
    if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
        kill "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
    rm -rf "$DIR"
}
trap cleanup EXIT INT TERM

# A free port (scripts/peers/ports.sh: Node.js, or bash alone; no Python).
# shellcheck source=scripts/peers/ports.sh
source scripts/peers/ports.sh
PORT="$(free_port)"

redis-server --bind 127.0.0.1 --port "$PORT" --dir "$DIR" \
    --save "" --appendonly no --daemonize no --logfile "$DIR/redis.log" &
PID=$!

for _ in $(seq 1 100); do
    if redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; then
        break
    fi
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "run-redis-tests: redis-server exited at start:" >&2
        cat "$DIR/redis.log" >&2 || true
        exit 1
    fi
    sleep 0.1
done
if ! redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; then
    echo "run-redis-tests: redis-server did not answer on 127.0.0.1:$PORT within 10 s:" >&2
    cat "$DIR/redis.log" >&2 || true
    exit 1
fi

export TOWER_AGENT_REDIS_URL="redis://127.0.0.1:$PORT/"
echo "run-redis-tests: redis-server on $TOWER_AGENT_REDIS_URL" >&2

cargo test --all-features --test stores --test stores_workers -- --ignored "$@"
