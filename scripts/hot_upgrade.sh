#!/usr/bin/env bash
# Upgrades a logic node N times under load (examples/hot_upgrade.cpp, docs/bus.md "Planned
# restart"): a root, a sender sending COUNT numbered messages to the logic node, and the logic node
# replaced by a new process every PERIOD seconds (SIGTERM: stop, hand the flow positions over; the
# new process inherits them and reattaches the shm inbox). Passes when every report is ok and every
# number was delivered exactly once across all the processes.
# UPGRADE=root replaces the root (the relay between sender and logic node) instead: its children
# reconnect to the new process on the same address, the sources resend what died with it.
# HANDOVER=1: the new process is started first and takes the old one's listening sockets and flow
# positions over (uvbus/handover.h), so no connection attempt to the root is ever refused (a prober
# connects every few milliseconds; with HANDOVER=1 it must never be refused).
#   [UPGRADE=logic|root] [HANDOVER=1] scripts/hot_upgrade.sh BUILD_DIR [CYCLES (20)] [COUNT (20000)]
#       [PERIOD (0.4)]
set -euo pipefail
BUILD=${1:?usage: hot_upgrade.sh BUILD_DIR [CYCLES] [COUNT] [PERIOD]}
CYCLES=${2:-20}
COUNT=${3:-20000}
PERIOD=${4:-0.4}
BIN=$BUILD/uvbus_example_hot_upgrade
DIR=$(mktemp -d)
SHM=uvbus-hot-upgrade-$$
pids=()
# Every failing command names itself and its line (functions too: errtrace); on a failure the
# files the run left are shown before they go, so a failed CI run says what it saw.
set -o errtrace
trap 'echo "hot_upgrade.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $?)" >&2' ERR
cleanup() {
  local rc=$?
  trap - ERR
  # Only this script's own processes, each waited for by its pid (a bare `wait` also waits for
  # the prober's subshell and warns about pids bash has already reaped).
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    echo "hot_upgrade.sh: failed (exit $rc); files in $DIR:" >&2
    ls -l "$DIR" >&2 2>/dev/null || echo "  (the directory is gone)" >&2
    for f in sender.out probe.out root.err; do
      [ -f "$DIR/$f" ] && { echo "--- $f" >&2; tail -n 20 "$DIR/$f" >&2; }
    done
    [ -f "$DIR/log" ] && echo "--- log: $(wc -l < "$DIR/log") lines" >&2
  fi
  rm -rf "$DIR" "/dev/shm/$SHM"
  exit "$rc"
}
trap cleanup EXIT
if [ "${HANDOVER:-0}" = 1 ]; then export HOT_UPGRADE_HANDOVER=$DIR/handover.ctl; fi

"$BIN" root "$DIR/url" & pids+=($!)
for _ in $(seq 100); do [ -s "$DIR/url" ] && break; sleep 0.05; done
URL=$(cat "$DIR/url")
start_logic() { "$BIN" logic "$URL" "$SHM" "$DIR/state" "$DIR/log" & logic=$!; pids+=($logic); }
# HANDOVER=1: the next process waits for the old one's state (started before the old one stops).
take_over() {  # take_over ROLE ARGS...: starts the successor, stops the old process, waits for it
  local old=$1; shift
  HOT_UPGRADE_TAKEOVER=1 "$BIN" "$@" & next=$!; pids+=($next)
  kill -TERM "$old"
  wait "$old" || { echo "$1 process exited with an error" >&2; exit 1; }
}
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
"$BIN" sender "$URL" "$COUNT" > "$DIR/sender.out" & sender=$!; pids+=($sender)
# A prober connects to the root's TCP address every few milliseconds while the sender runs and
# counts the attempts refused (the gap a hand-over closes).
hostport=${URL#ipv4://}
( ok=0; refused=0
  while kill -0 "$sender" 2>/dev/null; do
    if (exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}") 2>/dev/null; then ok=$((ok + 1));
    else refused=$((refused + 1)); fi
    sleep 0.002
  done
  echo "probe connects ok=$ok refused=$refused" > "$DIR/probe.out" ) & prober=$!; pids+=($prober)
for i in $(seq "$CYCLES"); do
  sleep "$PERIOD"
  if [ "${HANDOVER:-0}" = 1 ] && [ "${UPGRADE:-logic}" = root ]; then
    take_over "$root" root "$DIR/url2" "$URL"; root=$next
  elif [ "${HANDOVER:-0}" = 1 ]; then
    take_over "$logic" logic "$URL" "$SHM" "$DIR/state" "$DIR/log"; logic=$next
  elif [ "${UPGRADE:-logic}" = root ]; then
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
wait "$prober" || true
cat "$DIR/sender.out" "$DIR/probe.out"
# SIGINT until the last logic process is gone: a process started moments ago may not have its
# handler yet, and a background job of a script starts with SIGINT ignored, so one signal in that
# window is lost (the process would then run for ever). stop() is idempotent.
for _ in $(seq 300); do
  kill -INT "$logic" 2>/dev/null || break
  sleep 0.1
done
wait "$logic" || true
delivered=$(wc -l < "$DIR/log")
unique=$(sort -n -u "$DIR/log" | wc -l)
echo "upgrades (${UPGRADE:-logic})=$CYCLES sent=$COUNT delivered=$delivered unique=$unique duplicates=$((delivered - unique))"
grep -q "reports ok=$COUNT failed=0" "$DIR/sender.out" || { echo "not every report was ok" >&2; exit 1; }
[ "$unique" = "$COUNT" ] && [ "$delivered" = "$COUNT" ] || { echo "not delivered exactly once" >&2; exit 1; }
if [ "${HANDOVER:-0}" = 1 ]; then
  grep -q "refused=0\$" "$DIR/probe.out" || { echo "a connection was refused" >&2; exit 1; }
fi
