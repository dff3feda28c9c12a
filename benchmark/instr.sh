#!/usr/bin/env bash
# Instructions per message: one side of a benchmark pair runs under callgrind, the other natively,
# and the instructions that side executed inside main() (the payload pool, built before main(), is
# left out) are divided by the messages it sent or received. Unlike
# msg/s and CPU time this count does not move with the host's load, so it settles changes of a
# few per cent that timed runs on a shared machine cannot (docs/benchmark.md, "Instructions per
# message").
#
#   benchmark/instr.sh BUILD_DIR
#
# Environment: CASES (extended regex on case names, default all), SECONDS_PER_CASE (default 6:
# the sender's run; a side under callgrind runs about 50 times slower), MIN / MAX (payload sizes,
# default 8 / 128), OUT (a directory to keep the callgrind files in, for callgrind_annotate; a -g
# build gives line-level figures). Valgrind does not emulate AVX-512: the batch hash runs its AVX2
# kernel under callgrind, whatever the host has. UVBUS_MURMUR3 defaults to avx2 here: the automatic
# choice times the kernels (docs/core.md, "Dispatch"), and under callgrind's emulation that timing
# would pick either, moving the counts between runs.
#
# Exits 1 if a case gave no result.
#
# Cases: stream/send, stream/recv (bare ipv4 stream channel), node-tcp/send, node-tcp/recv,
# node-shm/send, node-shm/recv (bus nodes, end-to-end delivery), node-tcp/relay and node-shm/relay
# (the parent that forwards every message of a child to the root, over TCP or shared memory).
set -euo pipefail

BUILD=${1:?usage: instr.sh BUILD_DIR}
export UVBUS_MURMUR3=${UVBUS_MURMUR3:-avx2}
command -v valgrind >/dev/null || { echo "instr.sh needs valgrind" >&2; exit 2; }
MIN=${MIN:-8}
MAX=${MAX:-128}
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_setup instr uvbus_bench_stream_recv uvbus_bench_stream_send uvbus_bench_node_recv \
  uvbus_bench_node_send
SHM=uvbus-instr-$$
FAILED=0
CG="valgrind --tool=callgrind --collect-atstart=no --toggle-collect=main"

# total_ir FILE: the instructions a callgrind output file counted.
total_ir() { sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$1" | head -1; }

# wait_file FILE: waits up to 30 s for a --ready file.
wait_file() {
  for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.05; done
  echo "no ready file $1" >&2
  return 1
}

# measure NAME SIDE KIND: runs the pair of KIND (stream | node-tcp | node-shm | relay | relay-shm)
# with SIDE (send | recv | relay) under callgrind and prints NAME, instructions per message and
# messages.
measure() {
  local name=$1 side=$2 kind=$3
  [[ $name =~ $CASES ]] || return 0
  local recv=$BUILD/uvbus_bench_stream_recv send=$BUILD/uvbus_bench_stream_send
  local rargs=(ipv4://127.0.0.1:0) sargs=() cgf=$TMP/${name////_}.cg
  case $kind in
    node-* | relay*) recv=$BUILD/uvbus_bench_node_recv send=$BUILD/uvbus_bench_node_send ;;
  esac
  case $kind in
    node-tcp | relay) sargs=(--no-shm) ;;
    node-shm | relay-shm) rargs+=(--shm "$SHM") ;;
  esac
  local pargs=(ipv4://127.0.0.1:0)
  [ "$kind" != relay-shm ] || pargs+=(--shm "$SHM-relay")
  local on_r=$ON_RECV on_s=$ON_SEND on_p=""
  [ "$side" = recv ] && on_r="$ON_RECV $CG --callgrind-out-file=$cgf"
  [ "$side" = send ] && on_s="$ON_SEND $CG --callgrind-out-file=$cgf"
  [ "$side" = relay ] && on_p="$CG --callgrind-out-file=$cgf"
  local rsecs=$((SECS * 3 + 20))
  rm -f "$TMP/ready" "$TMP/ready.relay"
  # shellcheck disable=SC2086
  $on_r "$recv" "${rargs[@]}" --min "$MIN" --max "$MAX" --seconds "$rsecs" --ready "$TMP/ready" \
    >"$TMP/recv.out" 2>&1 &
  local rpid=$! ppid=""
  wait_file "$TMP/ready" || { kill "$rpid" 2>/dev/null; return 0; }
  local url
  url=$(cat "$TMP/ready")
  if [ "$side" = relay ]; then
    # shellcheck disable=SC2086
    $on_p "$recv" "${pargs[@]}" --relay-of "$url" --seconds "$rsecs" \
      --ready "$TMP/ready.relay" >"$TMP/relay.out" 2>&1 &
    ppid=$!
    wait_file "$TMP/ready.relay" || { kill "$rpid" "$ppid" 2>/dev/null; return 0; }
    url=$(cat "$TMP/ready.relay")
    sargs+=(--id 0x1101)
  fi
  # shellcheck disable=SC2086
  $on_s "$send" "$url" "${sargs[@]}" --min "$MIN" --max "$MAX" --seconds "$SECS" \
    >"$TMP/send.out" 2>&1 || true
  wait "$rpid" || true
  [ -z "$ppid" ] || wait "$ppid" || true
  local msgs
  if [ "$side" = send ]; then
    msgs=$(sed -n 's/^\[send\].* msgs=\([0-9]*\).*/\1/p' "$TMP/send.out" | head -1)
  else
    msgs=$(json_field "$(grep '^{"bench"' "$TMP/recv.out" | tail -1)" msgs)
  fi
  local ir
  ir=$(total_ir "$cgf")
  if [ -z "$msgs" ] || [ "$msgs" = 0 ] || [ -z "$ir" ]; then
    echo "$name: no result" >&2
    cat "$TMP/send.out" "$TMP/recv.out" >&2
    FAILED=1
    return 0
  fi
  [ -z "${OUT:-}" ] || { mkdir -p "$OUT" && cp "$cgf" "$OUT/"; }
  local per
  per=$(awk -v i="$ir" -v m="$msgs" 'BEGIN { printf "%.1f", i / m }')
  printf '| %-15s | %9s | %10s |\n' "$name" "$per" "$msgs"
  JSON+=("{\"case\":\"$name\",\"instr_per_msg\":$per,\"msgs\":$msgs,\"min\":$MIN,\"max\":$MAX}")
}

echo "| case            | instr/msg |   messages |"
echo "|-----------------|----------:|-----------:|"
measure stream/send send stream
measure stream/recv recv stream
measure node-tcp/send send node-tcp
measure node-tcp/recv recv node-tcp
measure node-shm/send send node-shm
measure node-shm/recv recv node-shm
measure node-tcp/relay relay relay
measure node-shm/relay relay relay-shm
rm -f "/dev/shm/$SHM"*
[ "${#JSON[@]}" -eq 0 ] || printf '%s\n' "${JSON[@]}"
exit "$FAILED"
