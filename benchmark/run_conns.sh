#!/usr/bin/env bash
# Connections at scale (uvbus_bench_conns): 1 000 / 5 000 / 10 000 / 19 000 connections at 1 msg/s
# each; a fixed total of 200 000 msg/s over 100 -> 10 000 connections; and the unix-socket study
# (1 000 streams x 320 B every 40 ms, unix vs TCP); the fixed total again with the receiver on two
# loop threads (--loops 2). Prints one table row per case, then every
# JSON line. Memory columns are the receiver's bytes per connection over its state before the
# first connection: RSS and malloc's heap in use, when all are connected and idle, at the end of
# the measured interval, and after 1.5 s of quiet; slab is the kernel's slab growth per connection
# (system-wide, both ends of the connection on this host, socket structures included); the kernel's
# TCP buffer memory is in the JSON (kernel_tcp_buf_kib, system-wide); conn/s is how many
# connections a second the receiver accepted while the clients set them up (connect_s in the JSON).
#
#   benchmark/run_conns.sh BUILD_DIR
#
# Environment: SECONDS_PER_CASE (default 10), CASES (extended regex on case names, default all),
# PROCS (client processes, default 4), ECHO (1: the receiver echoes every message: --echo),
# CONNS_MAX (largest connection count tried, default 19000; the descriptor limit must allow it).
set -euo pipefail
BUILD=${1:?usage: run_conns.sh BUILD_DIR}
SECS=${SECONDS_PER_CASE:-10}
CASES=${CASES:-.}
PROCS=${PROCS:-4}
CONNS_MAX=${CONNS_MAX:-19000}
BIN=$BUILD/uvbus_bench_conns
[ -x "$BIN" ] || { echo "missing $BIN" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
ECHO_FLAG=""
[ "${ECHO:-0}" = 1 ] && ECHO_FLAG="--echo"
ROWS=()
JSON=()

one() {  # one NAME FLAGS...
  local name=$1
  shift
  [[ $name =~ $CASES ]] || return 0
  local j
  # shellcheck disable=SC2086
  j=$("$BIN" "$@" --seconds "$SECS" --procs "$PROCS" $ECHO_FLAG 2>/dev/null | grep '^{' || true)
  [ -n "$j" ] || { echo "$name: no result" >&2; return 0; }
  JSON+=("${j%\}},\"case\":\"$name\"}")
  local f
  f() { json_field "$j" "$1"; }
  ROWS+=("$(printf '%-22s %6s %7s %8s %5s %5s %7s %8s %8s %6s %6s %6s %6s %6s %6s %6s %7s %5s' "$name" \
    "$(f connections)" "$(f target_msgs_per_s)" "$(f msgs_per_s)" "$(f held)" "$(f cpu_pct)" \
    "$(f cpu_ns_per_msg)" "$(f p50_us)" "$(f p99_us)" "$(f rss_idle_b_per_conn)" \
    "$(f rss_active_b_per_conn)" "$(f rss_quiet_b_per_conn)" "$(f heap_idle_b_per_conn)" \
    "$(f heap_active_b_per_conn)" "$(f heap_quiet_b_per_conn)" "$(f kernel_slab_b_per_conn)" \
    "$(f connects_per_s)" "$(f rc)")")
}

for n in 1000 5000 10000 19000; do
  [ "$n" -le "$CONNS_MAX" ] || continue
  one "rate1/$n" --connections "$n" --rate 1
done
for n in 100 1000 10000; do
  one "total200k/$n" --connections "$n" --total-rate 200000
done
# The receiver with two loop threads, one channel each on one port (tcp_reuse_port).
for n in 1000 10000; do
  one "total200k-2loops/$n" --connections "$n" --total-rate 200000 --loops 2
done
one "study/unix" --connections 1000 --rate 25 --min 320 --max 320 --unix
one "study/tcp" --connections 1000 --rate 25 --min 320 --max 320

echo "# uvbus_bench_conns, ${SECS}s measured per case, $PROCS client processes, echo ${ECHO:-0}," \
  "load average: $(cut -d' ' -f1-3 /proc/loadavg); memory in bytes per connection (receiver)"
printf '%-22s %6s %7s %8s %5s %5s %7s %8s %8s %6s %6s %6s %6s %6s %6s %6s %7s %5s\n' case \
  conns target msg/s held cpu% ns/msg p50_us p99_us rss-i rss-a rss-q heap-i heap-a heap-q slab \
  conn/s rc
for r in "${ROWS[@]}"; do echo "$r"; done
for j in "${JSON[@]}"; do echo "$j"; done
