#!/usr/bin/env bash
# Stream channel benchmarks: receiver/sender pairs over ipv4, ipv6 and unix sockets with small
# (8-128 B) and large (8-16384 B) payloads, small also with --no-merge, then 64 B ping-pong latency
# over tcp and unix. Prints one table row per case, then every JSON line. snd-ns / rcv-ns: CPU
# nanoseconds (user + system, getrusage) per message of the sender / receiver process.
#
#   benchmark/run_stream.sh BUILD_DIR
#
# Environment: SECONDS_PER_CASE (default 5), CASES (extended regex on case names, default all),
# ROUND_TRIPS (default 200000), SEND_CPU (0), RECV_CPU (1), PIN (1; 0 = no taskset).
set -euo pipefail

BUILD=${1:?usage: run_stream.sh BUILD_DIR}
ROUND_TRIPS=${ROUND_TRIPS:-200000}
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_setup stream uvbus_bench_stream_recv uvbus_bench_stream_send uvbus_bench_stream_pingpong

# url_for KIND: a listen URL with an ephemeral port (or a fresh unix path).
url_for() {
  case $1 in
    ipv4) echo "ipv4://127.0.0.1:0" ;;
    ipv6) echo "ipv6://[::1]:0" ;;
    unix) echo "unix://$TMP/bench-$RANDOM.sock" ;;
  esac
}

run_pair() {  # run_pair NAME KIND MIN MAX [sender flags...]
  local name=$1 kind=$2 min=$3 max=$4
  shift 4
  [[ $name =~ $CASES ]] || return 0
  local file=${name////_}
  local ready=$TMP/$file.ready out=$TMP/$file.recv
  rm -f "$ready"
  $ON_RECV "$BUILD/uvbus_bench_stream_recv" "$(url_for "$kind")" --min "$min" --max "$max" \
    --seconds "$SECS" --ready "$ready" >"$out" 2>&1 &
  local rpid=$!
  wait_ready "$name" receiver "$ready" "$out" 100 "$rpid" || return 0
  local send_line
  send_line=$($ON_SEND "$BUILD/uvbus_bench_stream_send" "$(cat "$ready")" --min "$min" --max "$max" \
    --seconds "$SECS" "$@" | grep '^\[send\]' || true)
  wait "$rpid" || true
  recv_json "$name" "$out" || return 0
  local j=$J sns
  sns=$(send_cpu_ns <<<"$send_line")
  j=$(with_send_ns "$j" "$sns")
  JSON+=("${j%\}},\"case\":\"$name\"}")
  local writes merged
  writes=$(sed -n 's/.*write_calls=\([0-9]*\).*/\1/p' <<<"$send_line")
  merged=$(sed -n 's/.*merged=\([0-9]*\).*/\1/p' <<<"$send_line")
  ROWS+=("$(printf '%-22s %12s %9s %7s %8s %8s %12s %12s %6s' "$name" \
    "$(json_field "$j" msgs_per_s)" "$(json_field "$j" mb_per_s)" "$(json_field "$j" cpu_pct)" \
    "$sns" "$(json_field "$j" cpu_ns_per_msg)" "${writes:-?}" "${merged:-?}" \
    "$(json_field "$j" errors)")")
}

for kind in ipv4 ipv6 unix; do
  run_pair "$kind/small" "$kind" 8 128
  run_pair "$kind/small/no-merge" "$kind" 8 128 --no-merge
  run_pair "$kind/large" "$kind" 8 16384
done

for kind in ipv4 unix; do
  name="$kind/pingpong64"
  [[ $name =~ $CASES ]] || continue
  line=$("$BUILD/uvbus_bench_stream_pingpong" "$(url_for "$kind")" --size 64 \
    --round-trips "$ROUND_TRIPS" --client-cpu "$SEND_CPU" --server-cpu "$RECV_CPU" | grep '^{' || true)
  [ -n "$line" ] || { echo "$name: no result" >&2; continue; }
  add_latency "$name" 22 "$line"
done

echo "# uvbus stream channel, ${SECS}s per case, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-22s %12s %9s %7s %8s %8s %12s %12s %6s\n' case msgs/s MB/s rcv-cpu snd-ns rcv-ns \
  write_calls merged errors
print_results 22
