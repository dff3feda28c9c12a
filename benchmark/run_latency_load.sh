#!/usr/bin/env bash
# Latency under load: 64 B round trips (p50/p99/p99.9) while the same link carries LOAD_PCT % (50)
# of its maximum small-message throughput, over TCP (stream channel), shared memory (busy-poll)
# and between two bus nodes over TCP and over shared memory (node-tcp, node-shm: the load is data
# messages of the node, end-to-end delivery), beside the same ping-pong without load. The maximum
# is measured first in the same sitting (64 B sender/receiver pair, as fast as it goes); each case
# runs REPEAT times, alternating loaded and unloaded, and the table shows medians. raw-tcp and
# raw-shm are the floor: uvbus_raw_ceiling's blocking-socket and busy-polled-ring ping-pong under
# the same load rate as tcp and shm (--load-rate, the same pacing). Then every JSON line.
#
#   benchmark/run_latency_load.sh BUILD_DIR
#
# Environment: SECONDS_PER_CASE (3, for the maximum), ROUND_TRIPS (50000), REPEAT (3),
# LOAD_PCT (50), CASES (extended regex on tcp / shm / node-tcp / node-shm / raw-tcp / raw-shm),
# SEND_CPU (0),
# RECV_CPU (1), PIN (1). Every JSON line also has the client's CPU per round trip.
set -euo pipefail
BUILD=${1:?usage: run_latency_load.sh BUILD_DIR}
ROUND_TRIPS=${ROUND_TRIPS:-50000}
REPEAT=${REPEAT:-3}
LOAD_PCT=${LOAD_PCT:-50}
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_setup latload uvbus_bench_stream_recv uvbus_bench_stream_send uvbus_bench_stream_pingpong \
  uvbus_bench_shm_recv uvbus_bench_shm_send uvbus_bench_shm_pingpong uvbus_bench_node_recv \
  uvbus_bench_node_send uvbus_bench_node_latency uvbus_raw_ceiling

med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

max_rate() {  # max_rate tcp|shm|node-tcp|node-shm: the receiver's median msgs/s for 64 B messages
  local ready=$TMP/$1.ready out=$TMP/$1.max url recv send rargs=""
  rm -f "$ready"
  case $1 in
    tcp) recv=uvbus_bench_stream_recv send=uvbus_bench_stream_send url=ipv4://127.0.0.1:0 ;;
    shm) recv=uvbus_bench_shm_recv send=uvbus_bench_shm_send url="shm://uvbus-latload-$$" ;;
    node-tcp) recv=uvbus_bench_node_recv send=uvbus_bench_node_send url=ipv4://127.0.0.1:0 ;;
    node-shm)
      recv=uvbus_bench_node_recv send=uvbus_bench_node_send url=ipv4://127.0.0.1:0
      rargs="--shm uvbus-latload-n$$"
      ;;
  esac
  # shellcheck disable=SC2086
  $ON_RECV "$BUILD/$recv" "$url" $rargs --min 64 --max 64 --seconds "$SECS" --ready "$ready" \
    >"$out" 2>&1 &
  local rpid=$!
  for _ in $(seq 100); do [ -f "$ready" ] && break; sleep 0.05; done
  local target=$url
  case $1 in tcp | node-*) target=$(cat "$ready") ;; esac
  local sargs=""
  [ "$1" = node-tcp ] && sargs="--no-shm"
  # The ping-pong's load is one send() per record, so its maximum is the single-send one (a
  # batched sender reaches twice as much, a rate single sends could only queue behind).
  [ "$1" = shm ] && sargs="--batch-bytes 0"
  # shellcheck disable=SC2086
  $ON_SEND "$BUILD/$send" "$target" $sargs --min 64 --max 64 --seconds "$SECS" >/dev/null 2>&1 || true
  wait "$rpid" || true
  json_field "$(grep '^{"bench"' "$out" | tail -1)" msgs_per_s
}

pp() {  # pp tcp|shm|node-tcp|node-shm LOAD_RATE: one ping-pong's JSON line
  local common=(--size 64 --round-trips "$ROUND_TRIPS" --client-cpu "$SEND_CPU"
    --server-cpu "$RECV_CPU" --load-rate "$2")
  case $1 in
    tcp) "$BUILD/uvbus_bench_stream_pingpong" ipv4://127.0.0.1:0 "${common[@]}" ;;
    shm) "$BUILD/uvbus_bench_shm_pingpong" "shm://uvbus-latload-pp-$$" "${common[@]}" ;;
    node-tcp) "$BUILD/uvbus_bench_node_latency" ipv4://127.0.0.1:0 "${common[@]}" ;;
    node-shm)
      "$BUILD/uvbus_bench_node_latency" ipv4://127.0.0.1:0 --shm "uvbus-latload-npp$$" "${common[@]}"
      ;;
    raw-*)
      local pin=()
      [ "$PIN" = 1 ] || pin=(--no-pin)
      "$BUILD/uvbus_raw_ceiling" "${1#raw-}-pingpong" --size 64 --round-trips "$ROUND_TRIPS" \
        --send-cpu "$SEND_CPU" --recv-cpu "$RECV_CPU" --load-rate "$2" "${pin[@]}"
      ;;
  esac | grep '^{' || true
}

declare -A MAX

for link in tcp shm node-tcp node-shm raw-tcp raw-shm; do
  [[ $link =~ $CASES ]] || continue
  # The raw floor runs under the load rate of the uvbus link it is the floor of.
  base=${link#raw-}
  [ -n "${MAX[$base]:-}" ] || MAX[$base]=$(max_rate "$base")
  max=${MAX[$base]}
  load=$(awk -v m="$max" -v p="$LOAD_PCT" 'BEGIN {printf "%.0f", m * p / 100}')
  declare -A P50 P99 P999 ACH
  for mode in idle loaded; do P50[$mode]=""; P99[$mode]=""; P999[$mode]=""; ACH[$mode]=""; done
  for _ in $(seq "$REPEAT"); do
    for mode in idle loaded; do
      rate=0
      [ "$mode" = loaded ] && rate=$load
      j=$(pp "$link" "$rate")
      [ -n "$j" ] || { echo "$link/$mode: no result" >&2; continue; }
      JSON+=("${j%\}},\"case\":\"$link/$mode\",\"max_msgs_per_s\":$max}")
      P50[$mode]+=" $(json_field "$j" p50_us)"
      P99[$mode]+=" $(json_field "$j" p99_us)"
      P999[$mode]+=" $(json_field "$j" p999_us)"
      ACH[$mode]+=" $(json_field "$j" load_achieved)"
    done
  done
  for mode in idle loaded; do
    # shellcheck disable=SC2086
    ROWS+=("$(printf '%-12s %10s %10s %10s %9s %9s %9s' "$link/$mode" "$max" \
      "$([ "$mode" = loaded ] && echo "$load" || echo 0)" "$(med ${ACH[$mode]})" \
      "$(med ${P50[$mode]})" "$(med ${P99[$mode]})" "$(med ${P999[$mode]})")")
  done
done

echo "# latency under load, 64 B, ${ROUND_TRIPS} round trips, median of $REPEAT," \
  "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-12s %10s %10s %10s %9s %9s %9s\n' case max_msg/s load_asked load_got p50_us p99_us p99.9_us
for r in "${ROWS[@]}"; do echo "$r"; done
for j in "${JSON[@]}"; do echo "$j"; done
