#!/usr/bin/env bash
# README's benchmark command: installs what is missing, builds Release from scratch, and runs the
# sender/receiver benchmarks of every channel (and the bus) plus the core microbenchmarks, printing
# one table per part and the JSON lines at the end.
#
#   SECONDS_PER_CASE=5   seconds each throughput case sends
#   PARTS="micro stream shm bus"   which parts to run
#   BASELINE=/path/to/run.sh   also run the machine's raw baseline script in the same sitting
#                        (none by default)
#   BUILD=build-bench
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/deps.sh
BUILD=${BUILD:-build-bench}
export SECONDS_PER_CASE=${SECONDS_PER_CASE:-5}
PARTS=${PARTS:-"micro stream shm bus"}
rm -rf "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DUVBUS_BUILD_TESTS=OFF \
  -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" >/dev/null

echo "# uvbus benchmarks $(date -u +%FT%TZ) on $(nproc) cores," \
  "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); load $(cut -d' ' -f1-3 /proc/loadavg)"
for part in $PARTS; do
  case $part in
    micro)
      echo "## core microbenchmarks"
      "$BUILD/uvbus_micro_core" --benchmark_min_time=0.3 2>/dev/null |
        grep -E '^(BM_|Benchmark|---)' || true
      ;;
    *)
      if [ -x "benchmark/run_$part.sh" ]; then
        echo "## $part"
        bash "benchmark/run_$part.sh" "$BUILD"
      fi
      ;;
  esac
done

BASELINE=${BASELINE:-}
if [ -n "$BASELINE" ] && { [ -x "$BASELINE" ] || [ -f "$BASELINE" ]; }; then
  echo "## raw baseline of this machine, same sitting ($BASELINE)"
  DURATION=$SECONDS_PER_CASE bash "$BASELINE" | grep -v '^{"baseline"' || true
fi
