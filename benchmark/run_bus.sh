#!/usr/bin/env bash
# Bus node benchmarks: node-to-node throughput (8-128 B by default) over TCP and over shared memory
# (the node's automatic choice: same host + a ring offered), direct and forwarded through a relay
# node, each beside the raw channel's own benchmark over the same transport in the same run; then
# 64 B round-trip latency node-to-node over TCP and shared memory. Prints one table row per case
# (with the ratio to the raw channel; snd-ns / rcv-ns: CPU nanoseconds per message, user + system
# from getrusage, of the sender / receiver process, last run) and then every JSON line.
#
#   benchmark/run_bus.sh BUILD_DIR
#
# Environment: SECONDS_PER_CASE (default 5), MIN/MAX payload bytes (8/128), CASES (extended regex
# on case names, default all), REPEAT (runs per case, default 1; the table shows the median),
# ROUND_TRIPS (default 100000), SEND_CPU (0), RECV_CPU (1), PIN (1; 0 = no taskset),
# REPORTS (0; 1 = the node senders set on_report: every message gets its delivery report),
# DELIVERY (end_to_end, the node default; next_hop: the node senders use next-hop delivery),
# METRICS (1: the node senders serve metrics and render them once a second), LATENCY (1: the node
# senders keep latency histograms).
# The raw-*-node-size cases run the bare channel with payloads of MIN+44..MAX+44 B (MIN+36.. with
# DELIVERY=next_hop): frames as long as the node's, so node / raw-node-size is the cost of the
# node's own work and raw-node-size / raw the cost of its header's bytes.
# Relay cases run three processes: the receiver (root node, RECV_CPU), a relay node of its own
# (its child, not pinned: with two cores it shares them with the others) and the sender (a child
# of the relay, SEND_CPU), so every message is forwarded once by a parent.
set -euo pipefail

BUILD=${1:?usage: run_bus.sh BUILD_DIR}
MIN=${MIN:-8}
MAX=${MAX:-128}
REPEAT=${REPEAT:-1}
ROUND_TRIPS=${ROUND_TRIPS:-100000}
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_setup bus uvbus_bench_node_recv uvbus_bench_node_send uvbus_bench_node_latency

declare -A RATE

median() {  # median N...
  printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {if (NR == 0) print 0; else if (NR % 2) print a[(NR+1)/2]; else printf "%.0f\n", (a[NR/2]+a[NR/2+1])/2}'
}

# one_run NAME RECV_BIN SEND_BIN "RECV ARGS" "SEND ARGS" ["RELAY ARGS"]: one receiver+sender
# pair (with a relay process between them when RELAY ARGS are given); prints the receiver's JSON
# line (empty on failure).
one_run() {
  local name=$1 recv=$2 send=$3 rargs=$4 sargs=$5 relay=${6:-}
  local file=${name////_}
  local ready=$TMP/$file.ready out=$TMP/$file.recv
  rm -f "$ready" "$ready.relay"
  # shellcheck disable=SC2086
  $ON_RECV "$recv" $rargs --min "${CASE_MIN:-$MIN}" --max "${CASE_MAX:-$MAX}" --seconds "$SECS" \
    --ready "$ready" >"$out" 2>&1 &
  local rpid=$!
  wait_ready "$name" receiver "$ready" "$out" 200 "$rpid" || return 0
  local ppid=""
  if [ -n "$relay" ]; then
    # shellcheck disable=SC2086
    "$recv" $relay --relay-of "$(cat "$ready")" --seconds "$SECS" --ready "$ready.relay" \
      >"$out.relay" 2>&1 &
    ppid=$!
    wait_ready "$name" relay "$ready.relay" "$out.relay" 200 "$rpid" "$ppid" || return 0
    mv "$ready.relay" "$ready"
  fi
  local extra=""
  if [ "${REPORTS:-0}" = 1 ] && [[ $send == *node_send ]]; then extra="--reports"; fi
  if [ "${DELIVERY:-}" = next_hop ] && [[ $send == *node_send ]]; then extra="$extra --next-hop"; fi
  if [ "${METRICS:-0}" = 1 ] && [[ $send == *node_send ]]; then extra="$extra --metrics"; fi
  if [ "${LATENCY:-0}" = 1 ] && [[ $send == *node_send ]]; then extra="$extra --latency"; fi
  # shellcheck disable=SC2086
  $ON_SEND "$send" "$(cat "$ready")" $sargs $extra --min "${CASE_MIN:-$MIN}" \
    --max "${CASE_MAX:-$MAX}" --seconds "$SECS" >"$out.send" 2>&1 || true
  wait "$rpid" || true
  [ -z "$ppid" ] || wait "$ppid" || true
  local j
  j=$(grep '^{"bench"' "$out" | tail -1 || true)
  [ -z "$j" ] || with_send_ns "$j" "$(send_cpu_ns <"$out.send")"
}

# run_case NAME BASELINE_NAME RECV_BIN SEND_BIN "RECV ARGS" "SEND ARGS" ["RELAY ARGS"]
run_case() {
  local name=$1 base=$2 recv=$3 send=$4 rargs=$5 sargs=$6 relay=${7:-}
  [[ $name =~ $CASES ]] || return 0
  [ -x "$recv" ] && [ -x "$send" ] || { echo "$name: skipped (no $(basename "$recv"))" >&2; return 0; }
  local rates=() j last=""
  for _ in $(seq "$REPEAT"); do
    j=$(one_run "$name" "$recv" "$send" "$rargs" "$sargs" "$relay")
    [ -n "$j" ] || { echo "$name: no result" >&2; continue; }
    JSON+=("${j%\}},\"case\":\"$name\"}")
    rates+=("$(json_field "$j" msgs_per_s)")
    last=$j
  done
  [ -n "$last" ] || return 0
  local rate
  rate=$(median "${rates[@]}")
  RATE[$name]=$rate
  local ratio="-"
  if [ -n "$base" ] && [ -n "${RATE[$base]:-}" ] && [ "${RATE[$base]}" != 0 ]; then
    ratio=$(awk -v a="$rate" -v b="${RATE[$base]}" 'BEGIN {printf "%.0f%%", 100 * a / b}')
  fi
  local mb
  mb=$(awk -v r="$rate" -v m="$(json_field "$last" mb_per_s)" -v l="$(json_field "$last" msgs_per_s)" \
    'BEGIN {if (l > 0) printf "%.1f", m * r / l; else print 0}')
  local sns
  sns=$(json_field "$last" send_cpu_ns_per_msg)
  ROWS+=("$(printf '%-24s %12s %9s %7s %8s %8s %8s %6s' "$name" "$rate" "$mb" \
    "$(json_field "$last" cpu_pct)" "${sns:-?}" "$(json_field "$last" cpu_ns_per_msg)" "$ratio" \
    "$(json_field "$last" errors)")")
}

SHM=uvbus-bus-bench-$$
N=$BUILD/uvbus_bench_node
run_case "tcp/raw-stream" "" "$BUILD/uvbus_bench_stream_recv" "$BUILD/uvbus_bench_stream_send" \
  "ipv4://127.0.0.1:0" ""
# The bare channel carrying frames as long as the node's (payload + the node's own header, 44 B
# with end-to-end delivery, 36 B next-hop): how much of the node's gap to the bare channel is the
# header's bytes, and how much the node's work.
HDR=44
[ "${DELIVERY:-}" != next_hop ] || HDR=36
CASE_MIN=$((MIN + HDR)) CASE_MAX=$((MAX + HDR)) run_case "tcp/raw-stream-node-size" "tcp/raw-stream" \
  "$BUILD/uvbus_bench_stream_recv" "$BUILD/uvbus_bench_stream_send" "ipv4://127.0.0.1:0" ""
run_case "tcp/node" "tcp/raw-stream" "${N}_recv" "${N}_send" "ipv4://127.0.0.1:0" "--no-shm"
run_case "tcp/node-relay" "tcp/raw-stream" "${N}_recv" "${N}_send" \
  "ipv4://127.0.0.1:0" "--no-shm --id 0x1101" "ipv4://127.0.0.1:0"
run_case "shm/raw-shm" "" "$BUILD/uvbus_bench_shm_recv" "$BUILD/uvbus_bench_shm_send" \
  "shm://$SHM-raw" ""
CASE_MIN=$((MIN + HDR)) CASE_MAX=$((MAX + HDR)) run_case "shm/raw-shm-node-size" "shm/raw-shm" \
  "$BUILD/uvbus_bench_shm_recv" "$BUILD/uvbus_bench_shm_send" "shm://$SHM-raw" ""
run_case "shm/node" "shm/raw-shm" "${N}_recv" "${N}_send" "ipv4://127.0.0.1:0 --shm $SHM" ""
run_case "shm/node-relay" "shm/raw-shm" "${N}_recv" "${N}_send" \
  "ipv4://127.0.0.1:0 --shm $SHM" "--id 0x1101" "ipv4://127.0.0.1:0 --shm $SHM"

lat_case() {  # lat_case NAME BIN URL [flags...]
  local name=$1 bin=$2 url=$3
  shift 3
  [[ $name =~ $CASES ]] || return 0
  [ -x "$bin" ] || return 0
  local line
  line=$("$bin" "$url" --size 64 --round-trips "$ROUND_TRIPS" --client-cpu "$SEND_CPU" \
    --server-cpu "$RECV_CPU" "$@" | grep '^{' || true)
  [ -n "$line" ] || { echo "$name: no result" >&2; return 0; }
  add_latency "$name" 24 "$line"
}
lat_case "tcp/raw-pingpong64" "$BUILD/uvbus_bench_stream_pingpong" "ipv4://127.0.0.1:0"
lat_case "tcp/node-pingpong64" "${N}_latency" "ipv4://127.0.0.1:0"
lat_case "shm/node-pingpong64" "${N}_latency" "ipv4://127.0.0.1:0" --shm "$SHM-lat"

echo "# uvbus bus nodes, ${MIN}-${MAX} B, ${SECS}s per case, median of $REPEAT," \
  "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-24s %12s %9s %7s %8s %8s %8s %6s\n' case msgs/s MB/s rcv-cpu snd-ns rcv-ns vs-raw errors
print_results 24
