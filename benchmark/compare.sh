#!/usr/bin/env bash
# uvbus against the raw ceilings of this machine, measured in the same sitting: ROUNDS alternating
# rounds of (raw ceilings, stream, shm, bus), then medians per case and ratios as a markdown table
# (benchmark/ratios.py), plus the data file for benchmark/chart.sh. The ceilings are the project's
# own uvbus_raw_ceiling (benchmark/run_raw.sh): coalesced TCP/unix and a shared-memory ring, plain
# and hashed (a MurmurHash3 per payload), and ping-pong. Throughput rows also give uvbus's CPU ns
# per message (sender / receiver, getrusage user + system, medians).
#
#   benchmark/compare.sh BUILD_DIR [OUT_DIR]     (default OUT_DIR /tmp/uvbus-compare)
#   ROUNDS=3 SECONDS_PER_CASE=3 PARTS="stream shm bus"
#   BASELINE=/path/to/run.sh   also run an independent raw baseline script each round (one that
#                              prints {"baseline":...} lines) and show how well the two agree
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:?usage: compare.sh BUILD_DIR [OUT_DIR]}
OUT=${2:-/tmp/uvbus-compare}
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_CASE:-3}
PARTS=${PARTS:-"stream shm bus"}
BASELINE=${BASELINE:-}
mkdir -p "$OUT"
: >"$OUT/all.jsonl"
tag() { grep '^{' | sed "s/}\$/$1,\"round\":$r}/" >>"$OUT/all.jsonl" || true; }
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r/$ROUNDS, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  SECONDS_PER_CASE=$SECS ROUND_TRIPS=100000 bash benchmark/run_raw.sh "$BUILD" 2>/dev/null | tag ""
  if [ -n "$BASELINE" ]; then
    {
      DURATION=$SECS DISTS="small large" \
        CASES='^(tcp-coalesced|unix-coalesced|shm-ring)(-hash)?$' bash "$BASELINE"
      TCP_HOST=::1 DURATION=$SECS DISTS="small large" CASES='^tcp-coalesced(-hash)?$' bash "$BASELINE"
      ROUND_TRIPS=100000 CASES='pingpong' bash "$BASELINE"
    } 2>/dev/null | grep '^{"baseline"' | tag ""
  fi
  for part in $PARTS; do
    SECONDS_PER_CASE=$SECS ROUND_TRIPS=100000 bash "benchmark/run_$part.sh" "$BUILD" 2>/dev/null |
      tag ",\"part\":\"$part\""
  done
done
python3 benchmark/ratios.py "$OUT"
echo "# data: $OUT/all.jsonl  table: $OUT/table.md  chart data: $OUT/chart.dat" >&2
