# shellcheck shell=bash
# Port helpers the peer scripts source. They need no Python: Node.js (which
# the npm peers need anyway) when it is here, else bash alone (/dev/tcp), so
# that TOWER_AGENT_NO_PYTHON=1 runs on a machine without python3.

# Whether something accepts connections on 127.0.0.1:$1 (bash's /dev/tcp).
port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# A free TCP port on 127.0.0.1: the one the kernel gives for port 0 (Node.js);
# without node, a random port below Linux's ephemeral range that nothing
# listens on.
free_port() {
  if command -v node >/dev/null 2>&1; then
    node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
    return
  fi
  local port i
  for ((i = 0; i < 100; i++)); do
    port=$((20000 + RANDOM % 12000))
    if ! port_open "$port"; then
      echo "$port"
      return 0
    fi
  done
  echo "free_port: no free port found on 127.0.0.1" >&2
  return 1
}
