#!/usr/bin/env bash
# Upgrades a logic node N times under load (examples/hot_upgrade.cpp, docs/bus.md "Planned
# restart"): a root, a sender sending COUNT numbered messages to the logic node, and the logic node
# replaced by a new process every PERIOD seconds (SIGTERM: stop, hand the flow positions over; the
# new process inherits them and reattaches the shm inbox). Passes when every report is ok and every
# number was delivered exactly once across all the processes.
# UPGRADE=root replaces the root (the relay between sender and logic node) instead: its children
# reconnect to the new process on the same address, the sources resend what died with it.
#   [UPGRADE=logic|root] scripts/hot_upgrade.sh BUILD_DIR [CYCLES (20)] [COUNT (20000)] [PERIOD (0.4)]
set -euo pipefail
BUILD=${1:?usage: hot_upgrade.sh BUILD_DIR [CYCLES] [COUNT] [PERIOD]}
CYCLES=${2:-20}
COUNT=${3:-20000}
PERIOD=${4:-0.4}
BIN=$BUILD/uvbus_example_hot_upgrade
DIR=$(mktemp -d)
SHM=uvbus-hot-upgrade-$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR" "/dev/shm/$SHM"
}
trap cleanup EXIT

"$BIN" root "$DIR/url" & pids+=($!)
for _ in $(seq 100); do [ -s "$DIR/url" ] && break; sleep 0.05; done
URL=$(cat "$DIR/url")
start_logic() { "$BIN" logic "$URL" "$SHM" "$DIR/state" "$DIR/log" & logic=$!; pids+=($logic); }
root=${pids[0]}
start_root() {  # the same address again (the old socket may take a moment to close)
  for _ in $(seq 100); do
    "$BIN" root "$DIR/url2" "$URL" 2>"$DIR/root.err" & root=$!
    sleep 0.05
    kill -0 "$root" 2>/dev/null && { pids+=($root); return 0; }
  done
  cat "$DIR/root.err" >&2; return 1
}
start_logic
"$BIN" sender "$URL" "$COUNT" > "$DIR/sender.out" & sender=$!
for i in $(seq "$CYCLES"); do
  sleep "$PERIOD"
  if [ "${UPGRADE:-logic}" = root ]; then
    kill -TERM "$root"
    wait "$root" || { echo "root process $i exited with an error" >&2; exit 1; }
    start_root
  else
    kill -TERM "$logic"
    wait "$logic" || { echo "logic process $i exited with an error" >&2; exit 1; }
    start_logic
  fi
done
wait "$sender" || true
cat "$DIR/sender.out"
kill -TERM "$logic"; wait "$logic" || true
delivered=$(wc -l < "$DIR/log")
unique=$(sort -n -u "$DIR/log" | wc -l)
echo "upgrades (${UPGRADE:-logic})=$CYCLES sent=$COUNT delivered=$delivered unique=$unique duplicates=$((delivered - unique))"
grep -q "reports ok=$COUNT failed=0" "$DIR/sender.out" && [ "$unique" = "$COUNT" ] && [ "$delivered" = "$COUNT" ]
