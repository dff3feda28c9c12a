#!/usr/bin/env bash
# The raw ceilings of this machine, measured by the project's own uvbus_raw_ceiling (plain sockets
# and shared memory, no library, no event loop): coalesced TCP (IPv4 and IPv6) and unix streams and
# a shared-memory ring, each plain and with a MurmurHash3 of every payload (-hash: the ceiling of a
# checksummed frame), small (8-128 B) and large (8-16384 B), then 64 B ping-pong over tcp, unix and
# shm. Prints one table row per case, then every JSON line ({"raw":...}).
#
#   benchmark/run_raw.sh BUILD_DIR
#
# Environment: SECONDS_PER_CASE (default 5), CASES (extended regex on "case/dist", default all),
# ROUND_TRIPS (default 200000), SEND_CPU (0), RECV_CPU (1), PIN (1; 0 = unpinned).
set -euo pipefail

BUILD=${1:?usage: run_raw.sh BUILD_DIR}
BIN=$BUILD/uvbus_raw_ceiling
[ -x "$BIN" ] || { echo "run_raw.sh: $BIN is missing (build the benchmark targets)" >&2; exit 1; }
SECS=${SECONDS_PER_CASE:-5}
CASES=${CASES:-.}
ROUND_TRIPS=${ROUND_TRIPS:-200000}
PIN_ARGS=(--send-cpu "${SEND_CPU:-0}" --recv-cpu "${RECV_CPU:-1}")
[ "${PIN:-1}" = 1 ] || PIN_ARGS=(--no-pin)
JSON=()

row() {  # row NAME ARGS...: runs one case, prints its table row, keeps its JSON line
  local name=$1
  shift
  [[ $name =~ $CASES ]] || return 0
  local j
  j=$("$BIN" "$@" "${PIN_ARGS[@]}" 2>/dev/null | grep '^{"raw"' || true)
  if [ -z "$j" ]; then
    printf '%-28s failed\n' "$name"
    return 0
  fi
  JSON+=("$j")
  python3 -c '
import json, sys
j = json.loads(sys.argv[2])
ok = "ok" if j["verified"] else "NOT VERIFIED"
g, n = j.get, sys.argv[1]
if "p50_us" in j:
    print("%-28s p50 %8.2f us  p99 %8.2f  p99.9 %8.2f  %s" % (n, g("p50_us"), g("p99_us"), g("p999_us"), ok))
else:
    print("%-28s %8.2f M msg/s %9.1f MB/s  cpu ns/msg %6.1f / %6.1f  %s" % (n, g("msgs_per_s") / 1e6,
          g("mb_per_s"), g("send_cpu_ns_per_msg"), g("cpu_ns_per_msg"), ok))
' "$name" "$j"
}

echo "# raw ceilings (uvbus_raw_ceiling), ${SECS} s per case; load $(cut -d' ' -f1-3 /proc/loadavg)"
for dist in small large; do
  for c in tcp-coalesced tcp-coalesced-hash unix-coalesced unix-coalesced-hash shm-ring \
    shm-ring-hash; do
    row "$c/$dist" "$c" --dist "$dist" --seconds "$SECS"
  done
  for c in tcp-coalesced tcp-coalesced-hash; do
    row "$c/$dist/ipv6" "$c" --dist "$dist" --seconds "$SECS" --host ::1
  done
done
for c in tcp-pingpong unix-pingpong shm-pingpong; do
  row "$c" "$c" --size 64 --round-trips "$ROUND_TRIPS" --warmup 10000
done
for j in ${JSON[@]+"${JSON[@]}"}; do echo "$j"; done
