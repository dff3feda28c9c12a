#!/usr/bin/env bash
# Soak run (issue 6): a 5-node tree mixing TCP and shared memory under a steady load for
# SECONDS (default 600), sampling RSS, open file descriptors and live heap every second. Fails if
# anything grows after the warm-up, any error occurs, or the delivery accounting does not add up.
# The test itself is test/hardening/soak_test.cpp (the suite runs it for 3 s).
#
#   benchmark/soak.sh [SECONDS] [RATE]     RATE: messages per second per flow (6 flows), default 2000
#   BUILD=dir (default build-soak, Release, no sanitizer)   CSV=file (default $BUILD/soak.csv)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-600}
rate=${2:-2000}
BUILD=${BUILD:-build-soak}
jobs=$(nproc)
[ "$jobs" -gt 2 ] && jobs=2
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DUVBUS_SANITIZE= \
  -DUVBUS_BUILD_BENCHMARKS=OFF -DUVBUS_BUILD_TESTS=ON >/dev/null
cmake --build "$BUILD" -j"$jobs" --target uvbus_soak_test
csv=${CSV:-$BUILD/soak.csv}
echo "soak: ${seconds} s, ${rate} msg/s per flow, samples -> $csv (load: $(cut -d' ' -f1-3 /proc/loadavg))"
UVBUS_SOAK_SECONDS=$seconds UVBUS_SOAK_RATE=$rate UVBUS_SOAK_CSV=$csv \
  "$BUILD/uvbus_soak_test" --gtest_brief=1
# First and last samples, for the record.
head -2 "$csv"
tail -1 "$csv"
