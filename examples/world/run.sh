#!/usr/bin/env bash
# The "world" example: etcd, two gateways, eight logic nodes and a chat node as eleven separate
# processes on this machine, with discovery only (no static URL: every node finds the others and
# its parent through etcd). It shows the directory, calls to "the logic node that owns this
# player" (consistent hashing), broadcast, and then kills with SIGKILL the gateway every node is
# registered to, and a logic node: the rest converge (the children move to the other gateway,
# the dead logic node leaves every directory, calls and broadcasts go on).
#
#   bash examples/world/run.sh [BUILD_DIR]     (default build-rel; builds uvbus_example_world)
#
# Prints a line per step and exits 0 when every step converged within its deadline, 1 (naming
# the step) otherwise. Each process's output is in $WORLD_DIR (a temporary directory, removed at
# the end unless KEEP=1). Needs /usr/bin/etcd (Debian's etcd-server; scripts/deps.sh installs it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD=${1:-build-rel}
if [ -z "${WORLD_BIN:-}" ]; then
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DUVBUS_BUILD_TESTS=OFF >/dev/null
  fi
  cmake --build "$BUILD" --target uvbus_example_world >/dev/null
  WORLD_BIN=$(find "$BUILD" -name uvbus_example_world -type f -perm -u+x | head -1)
fi
[ -x /usr/bin/etcd ] || { echo "world: /usr/bin/etcd is missing (bash scripts/deps.sh)" >&2; exit 1; }

WORLD_DIR=$(mktemp -d /tmp/uvbus-world-XXXXXX)
declare -A PID=()
cleanup() {
  for k in "${!PID[@]}"; do kill -9 "${PID[$k]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "world: logs kept in $WORLD_DIR"; else rm -rf "$WORLD_DIR"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CLIENT_PORT=$(free_port)
PEER_PORT=$(free_port)
ETCD=http://127.0.0.1:$CLIENT_PORT
/usr/bin/etcd --name world --data-dir "$WORLD_DIR/etcd" --log-level error \
  --listen-client-urls "$ETCD" --advertise-client-urls "$ETCD" \
  --listen-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-cluster "world=http://127.0.0.1:$PEER_PORT" >"$WORLD_DIR/etcd.log" 2>&1 &
PID[etcd]=$!

# until DEADLINE_S FILE PATTERN: waits until FILE has a line matching PATTERN (grep -E).
until_line() {
  local deadline=$(($(date +%s) + $1))
  while ! grep -qE "$3" "$WORLD_DIR/$2.log" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then return 1; fi
    sleep 0.1
  done
}
step() { printf 'world: %-62s' "$1"; }
ok() { echo "ok (${SECONDS}s)"; }
fail() {
  echo "FAILED"
  echo "world: step failed: $1 (logs: $WORLD_DIR)" >&2
  for f in "$WORLD_DIR"/*.log; do echo "--- $f" >&2; tail -5 "$f" >&2; done
  KEEP=1
  exit 1
}
start() {  # start NAME ROLE ID
  "$WORLD_BIN" "$2" "$3" "$ETCD" >"$WORLD_DIR/$1.log" 2>&1 &
  PID[$1]=$!
}

step "etcd on $ETCD"
for _ in $(seq 100); do
  curl -sf "$ETCD/health" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "$ETCD/health" >/dev/null || fail "etcd did not become healthy"
ok

SECONDS=0
step "start 2 gateways, 8 logic nodes, 1 chat node"
start gw1 gateway 1
start gw2 gateway 2
for i in 1 2 3 4 5 6 7 8; do start "logic$i" logic "1000$i"; done
start chat chat 10100
ok
step "every directory holds the 11 nodes"
for n in gw1 gw2 logic1 logic2 logic3 logic4 logic5 logic6 logic7 logic8 chat; do
  until_line 30 "$n" "DIR 11 nodes: chat 1, gateway 2, logic 8" || fail "$n's directory"
done
ok
step "every logic node and chat registered to gateway 0x1"
for n in logic1 logic2 logic3 logic4 logic5 logic6 logic7 logic8 chat; do
  until_line 30 "$n" "UP parent 0x1$" || fail "$n did not register to gw1"
done
ok
step "calls: gw1 logs players answered by their logic node"
until_line 30 gw1 "CALLS ok [1-9][0-9]*" || fail "calls through gw1"
ok
step "broadcast: chat reaches the 8 logic nodes"
until_line 30 chat "BCAST ok reached 8 failed 0 of 8" || fail "broadcast to 8"
ok

SECONDS=0
step "kill -9 gateway 0x1 (every child's parent)"
{ kill -9 "${PID[gw1]}" && wait "${PID[gw1]}"; } 2>/dev/null || true
unset 'PID[gw1]'
ok
step "children choose gateway 0x2 once 0x1's lease expires"
for n in logic1 logic2 logic3 logic4 logic5 logic6 logic7 logic8 chat; do
  until_line 30 "$n" "UP parent 0x2$" || fail "$n did not move to gw2"
done
ok
step "every directory drops gateway 0x1"
for n in gw2 logic1 logic2 logic3 logic4 logic5 logic6 logic7 logic8 chat; do
  until_line 30 "$n" "DIR 10 nodes: chat 1, gateway 1, logic 8" || fail "$n still lists gw1"
done
ok
step "calls go on through gw2"
until_line 30 gw2 "CALLS ok [1-9][0-9]*" || fail "calls through gw2"
ok

SECONDS=0
step "kill -9 logic node 0x10003"
{ kill -9 "${PID[logic3]}" && wait "${PID[logic3]}"; } 2>/dev/null || true
unset 'PID[logic3]'
ok
step "every directory drops it"
for n in gw2 logic1 logic2 logic4 logic5 logic6 logic7 logic8 chat; do
  until_line 30 "$n" "DIR 9 nodes: chat 1, gateway 1, logic 7" || fail "$n still lists logic 3"
done
ok
step "broadcast reaches the 7 left"
until_line 30 chat "BCAST ok reached 7 failed 0 of 7" || fail "broadcast to 7"
ok
step "its players moved: 3 s of calls with no new failure"
# A call in flight to the dead node fails when its 2 s timeout passes; after that, every player
# it owned is picked on a live node: the failed count stays put while ok grows.
deadline=$(($(date +%s) + 30))
streak=0
prev=""
while [ "$streak" -lt 3 ]; do
  [ "$(date +%s)" -ge "$deadline" ] && fail "gw2's calls kept failing"
  sleep 1
  last=$(grep "^gateway 0x2 CALLS" "$WORLD_DIR/gw2.log" | tail -1)
  now=$(echo "$last" | awk '{print $5, $7}')  # ok failed
  if [ -n "$prev" ] && [ "${now#* }" = "${prev#* }" ] && [ "${now% *}" -gt "${prev% *}" ]; then
    streak=$((streak + 1))
  else
    streak=0
  fi
  prev=$now
done
echo "ok: $last"

step "stop everything (SIGTERM: entries revoked)"
for k in "${!PID[@]}"; do [ "$k" = etcd ] || kill -TERM "${PID[$k]}" 2>/dev/null || true; done
for k in "${!PID[@]}"; do [ "$k" = etcd ] || wait "${PID[$k]}" 2>/dev/null || true; done
for k in "${!PID[@]}"; do [ "$k" = etcd ] || unset "PID[$k]"; done
ok
echo "world: done; gw2's last line: $(grep CALLS "$WORLD_DIR/gw2.log" | tail -1)"
