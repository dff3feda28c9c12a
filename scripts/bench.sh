#!/usr/bin/env bash
# README's benchmark command: installs what is missing, builds Release from scratch, and runs the
# core microbenchmarks, the machine's raw ceilings (the project's own uvbus_raw_ceiling: plain and
# hashed coalesced TCP/unix, a shared-memory ring, ping-pong) and the sender/receiver benchmarks of
# every channel and the bus, printing one table per part, then every uvbus figure as a ratio to the
# ceiling measured minutes before (benchmark/ratios.py), then the JSON lines.
#
#   SECONDS_PER_CASE=5   seconds each throughput case sends
#   PARTS="micro raw stream shm bus"   which parts to run
#   BASELINE=/path/to/run.sh   also run an independent raw baseline script in the same sitting
#                        (none by default); the ratio table then shows how the two ceilings agree
#   BUILD=build-bench
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/deps.sh
BUILD=${BUILD:-build-bench}
export SECONDS_PER_CASE=${SECONDS_PER_CASE:-5}
PARTS=${PARTS:-"micro raw stream shm bus"}
rm -rf "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DUVBUS_BUILD_TESTS=OFF \
  -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" >/dev/null

OUT=$(mktemp -d /tmp/uvbus-bench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
: >"$OUT/all.jsonl"
keep() {  # keep PART: passes the part's output through, keeping its JSON lines for the ratios
  tee "$OUT/part.txt" | grep -v '^{'
  grep '^{' "$OUT/part.txt" | sed "s/}\$/,\"part\":\"$1\",\"round\":1}/" >>"$OUT/all.jsonl" || true
}

echo "# uvbus benchmarks $(date -u +%FT%TZ) on $(nproc) cores," \
  "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); load $(cut -d' ' -f1-3 /proc/loadavg)"
for part in $PARTS; do
  case $part in
    micro)
      echo "## core microbenchmarks"
      "$BUILD/uvbus_micro_core" --benchmark_min_time=0.3 2>/dev/null |
        grep -E '^(BM_|Benchmark|---)' || true
      echo "## bus microbenchmarks"
      "$BUILD/uvbus_micro_bus" --benchmark_min_time=0.3 2>/dev/null | grep -E '^BM_' || true
      ;;
    *)
      if [ -x "benchmark/run_$part.sh" ]; then
        echo "## $part"
        bash "benchmark/run_$part.sh" "$BUILD" | keep "$part"
      fi
      ;;
  esac
done

BASELINE=${BASELINE:-}
if [ -n "$BASELINE" ] && { [ -x "$BASELINE" ] || [ -f "$BASELINE" ]; }; then
  echo "## independent raw baseline, same sitting ($BASELINE)"
  {
    DURATION=$SECONDS_PER_CASE DISTS="small large" \
      CASES='^(tcp-coalesced|unix-coalesced|shm-ring)(-hash)?$|pingpong' bash "$BASELINE"
    TCP_HOST=::1 DURATION=$SECONDS_PER_CASE DISTS="small large" CASES='^tcp-coalesced(-hash)?$' \
      bash "$BASELINE"
  } | keep baseline
fi

echo "## uvbus / the raw ceilings of this sitting (median ratio; hashed = with a MurmurHash3 per frame)"
python3 benchmark/ratios.py "$OUT"
echo "## JSON lines"
cat "$OUT/all.jsonl"
