#!/usr/bin/env bash
# README's test command: installs what is missing, builds uvbus from scratch with
# AddressSanitizer + UndefinedBehaviorSanitizer and -Werror, and runs the whole suite with ctest.
#   BUILD=dir (default build-test)   CTEST_ARGS="-L core" to select   TEST_JOBS=n tests at once
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/deps.sh
BUILD=${BUILD:-build-test}
rm -rf "$BUILD"
# Benchmarks are not tests: CI's Release build compiles them (with -Werror); skipping them here
# keeps the sanitizer build short, as does compiling the test sources in batches (unity build).
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUVBUS_WERROR=ON \
  -DUVBUS_SANITIZE=address,undefined -DUVBUS_BUILD_BENCHMARKS=OFF -DUVBUS_UNITY_TESTS=ON
cmake --build "$BUILD" -j"$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$BUILD"
# Two tests a core (at most 16 at once; TEST_JOBS=n to choose): many tests spend most of their
# time waiting on sockets, timers and the timeouts they test, so with one a core the cores idle
# (2 vCPUs: the suite in 97 s instead of 179). Every wait in a test is a deadline generous enough
# for a loaded machine, never a sleep, so the load this adds is safe.
jobs=$((2 * $(nproc)))
if [ "$jobs" -gt 16 ]; then jobs=16; fi
jobs=${TEST_JOBS:-$jobs}
# shellcheck disable=SC2086
ctest --output-on-failure -j"$jobs" --timeout 300 ${CTEST_ARGS:--LE soak}
