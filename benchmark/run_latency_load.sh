#!/usr/bin/env bash
# Latency under load: 64 B round trips (p50/p99/p99.9) while the same link carries LOAD_PCT % (50)
# of its maximum small-message throughput, over TCP (stream channel) and shared memory (busy-poll),
# beside the same ping-pong without load. The maximum is measured first in the same sitting
# (64 B sender/receiver pair, as fast as it goes); each case runs REPEAT times, alternating loaded
# and unloaded, and the table shows medians. Then every JSON line.
#
#   benchmark/run_latency_load.sh BUILD_DIR
#
# Environment: SECONDS_PER_CASE (3, for the maximum), ROUND_TRIPS (50000), REPEAT (3),
# LOAD_PCT (50), CASES (extended regex on tcp / shm), SEND_CPU (0), RECV_CPU (1), PIN (1).
set -euo pipefail
BUILD=${1:?usage: run_latency_load.sh BUILD_DIR}
ROUND_TRIPS=${ROUND_TRIPS:-50000}
REPEAT=${REPEAT:-3}
LOAD_PCT=${LOAD_PCT:-50}
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_setup latload uvbus_bench_stream_recv uvbus_bench_stream_send uvbus_bench_stream_pingpong \
  uvbus_bench_shm_recv uvbus_bench_shm_send uvbus_bench_shm_pingpong

med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

max_rate() {  # max_rate tcp|shm: the receiver's median msgs/s for 64 B messages
  local ready=$TMP/$1.ready out=$TMP/$1.max url
  rm -f "$ready"
  if [ "$1" = tcp ]; then
    $ON_RECV "$BUILD/uvbus_bench_stream_recv" ipv4://127.0.0.1:0 --min 64 --max 64 --seconds "$SECS" \
      --ready "$ready" >"$out" 2>&1 &
  else
    url="shm://uvbus-latload-$$"
    $ON_RECV "$BUILD/uvbus_bench_shm_recv" "$url" --min 64 --max 64 --seconds "$SECS" \
      --ready "$ready" >"$out" 2>&1 &
  fi
  local rpid=$!
  for _ in $(seq 100); do [ -f "$ready" ] && break; sleep 0.05; done
  if [ "$1" = tcp ]; then
    $ON_SEND "$BUILD/uvbus_bench_stream_send" "$(cat "$ready")" --min 64 --max 64 --seconds "$SECS" >/dev/null
  else
    $ON_SEND "$BUILD/uvbus_bench_shm_send" "$url" --min 64 --max 64 --seconds "$SECS" >/dev/null
  fi
  wait "$rpid" || true
  json_field "$(grep '^{"bench"' "$out" | tail -1)" msgs_per_s
}

pp() {  # pp tcp|shm LOAD_RATE: one ping-pong's JSON line
  if [ "$1" = tcp ]; then
    "$BUILD/uvbus_bench_stream_pingpong" ipv4://127.0.0.1:0 --size 64 --round-trips "$ROUND_TRIPS" \
      --client-cpu "$SEND_CPU" --server-cpu "$RECV_CPU" --load-rate "$2" | grep '^{' || true
  else
    "$BUILD/uvbus_bench_shm_pingpong" "shm://uvbus-latload-pp-$$" --size 64 \
      --round-trips "$ROUND_TRIPS" --client-cpu "$SEND_CPU" --server-cpu "$RECV_CPU" \
      --load-rate "$2" | grep '^{' || true
  fi
}

for link in tcp shm; do
  [[ $link =~ $CASES ]] || continue
  max=$(max_rate "$link")
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
