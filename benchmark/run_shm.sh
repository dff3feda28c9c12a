#!/usr/bin/env bash
# Shared-memory channel benchmarks: receiver/sender pairs with small (8-128 B) and large
# (8-16384 B) payloads, with 1 and 2 writer processes (all writers on the sender core), then 64 B
# round-trip latency over two rings, busy-polling and through the libuv loop. Prints one table row
# per case, then every JSON line. snd-ns / rcv-ns: CPU nanoseconds (user + system, getrusage) per
# message of the sender processes (weighted over the writers) / the receiver.
#
#   benchmark/run_shm.sh BUILD_DIR
#
# Senders batch their messages (shm_writer::send_batch, up to BATCH_BYTES of ring per batch);
# the */1w-single cases send one record per send() call (a plain writer), the */1w-coalesce cases
# one send() per message on a coalescing writer (shm_writer::coalesce, flushed every 256 sends).
#
# Environment: SECONDS_PER_CASE (default 5), CASES (extended regex on case names, default all),
# ROUND_TRIPS (default 200000), SEND_CPU (0), RECV_CPU (1), PIN (1; 0 = no taskset),
# BATCH_BYTES (4096).
set -euo pipefail

BUILD=${1:?usage: run_shm.sh BUILD_DIR}
ROUND_TRIPS=${ROUND_TRIPS:-200000}
BATCH_BYTES=${BATCH_BYTES:-4096}
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
bench_setup shm uvbus_bench_shm_recv uvbus_bench_shm_send uvbus_bench_shm_pingpong

run_pair() {  # run_pair NAME MIN MAX WRITERS [BATCH_BYTES [SENDER FLAGS]]
  local name=$1 min=$2 max=$3 writers=$4 batch=${5:-$BATCH_BYTES} extra=${6:-}
  [[ $name =~ $CASES ]] || return 0
  local file=${name////_}
  local ready=$TMP/$file.ready out=$TMP/$file.recv url="shm://uvbus-bench-$$-$file"
  rm -f "$ready"
  $ON_RECV "$BUILD/uvbus_bench_shm_recv" "$url" --min "$min" --max "$max" --seconds "$SECS" \
    --writers "$writers" --ready "$ready" >"$out" 2>&1 &
  local rpid=$!
  wait_ready "$name" receiver "$ready" "$out" 100 "$rpid" || return 0
  local send_out
  send_out=$($ON_SEND "$BUILD/uvbus_bench_shm_send" "$url" --min "$min" --max "$max" \
    --seconds "$SECS" --writers "$writers" --batch-bytes "$batch" $extra | grep '^\[send\]' ||
    true)
  wait "$rpid" || true
  recv_json "$name" "$out" || return 0
  local j=$J sns
  sns=$(send_cpu_ns <<<"$send_out")
  j=$(with_send_ns "$j" "$sns")
  JSON+=("${j%\}},\"case\":\"$name\"}")
  ROWS+=("$(printf '%-18s %12s %9s %7s %8s %8s %10s %9s %6s' "$name" \
    "$(json_field "$j" msgs_per_s)" "$(json_field "$j" mb_per_s)" "$(json_field "$j" cpu_pct)" \
    "$sns" "$(json_field "$j" cpu_ns_per_msg)" "$(json_field "$j" queue_full)" \
    "$(json_field "$j" abandoned)" "$(json_field "$j" errors)")")
}

for w in 1 2; do
  run_pair "small/${w}w" 8 128 "$w"
  run_pair "large/${w}w" 8 16384 "$w"
done
run_pair "small/1w-single" 8 128 1 0
run_pair "large/1w-single" 8 16384 1 0
run_pair "small/1w-coalesce" 8 128 1 0 "--coalesce 1"
run_pair "large/1w-coalesce" 8 16384 1 0 "--coalesce 1"

for mode in poll uv; do
  name="pingpong64/$mode"
  [[ $name =~ $CASES ]] || continue
  flag=""
  [ "$mode" = uv ] && flag="--uv"
  line=$("$BUILD/uvbus_bench_shm_pingpong" "shm://uvbus-bench-$$-pp-$mode" --size 64 \
    --round-trips "$ROUND_TRIPS" --client-cpu "$SEND_CPU" --server-cpu "$RECV_CPU" $flag |
    grep '^{' || true)
  [ -n "$line" ] || { echo "$name: no result" >&2; continue; }
  add_latency "$name" 16 "$line"
done

echo "# uvbus shm channel, ${SECS}s per case, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-18s %12s %9s %7s %8s %8s %10s %9s %6s\n' case msgs/s MB/s rcv-cpu snd-ns rcv-ns \
  queue_full abandoned errors
print_results 16
