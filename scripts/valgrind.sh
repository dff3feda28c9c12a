#!/usr/bin/env bash
# Builds the core tests without sanitizers and runs them under valgrind memcheck: any invalid
# access, use of uninitialised memory or leak (definite or indirect) fails the run.
#
#   scripts/valgrind.sh              the core tests
# Environment:
#   BUILD=dir                 build directory (default build-valgrind)
#   VALGRIND_TESTS="core shm" which components' test binaries to run (default core)
#   VALGRIND_TIMEOUT=s        wall-clock bound per binary (default 600)
#   GTEST_FILTER=...          passed through to googletest as usual
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${BUILD:-build-valgrind}
comps=${VALGRIND_TESTS:-core}
limit=${VALGRIND_TIMEOUT:-600}
# The batch hash's exhaustive bit-exactness tests (every length to 4096, random batches) are pure
# arithmetic over large inputs, the slowest under valgrind's emulation; the sanitizer builds run
# them in full. VALGRIND_GTEST_FILTER='*' runs everything.
filter=${VALGRIND_GTEST_FILTER:-"-*Murmur3Batch.EveryLengthUpTo4096*:*Murmur3Batch.RandomBatches*"}
jobs=$(nproc)
[ "$jobs" -gt 2 ] && jobs=2

# -O1 keeps the run fast while leaving stack traces readable; no sanitizer (valgrind cannot run
# ASan binaries) and no benchmarks.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DUVBUS_SANITIZE= -DUVBUS_BUILD_BENCHMARKS=OFF -DUVBUS_BUILD_TESTS=ON -DUVBUS_UNITY_TESTS=ON >/dev/null
targets=()
for c in $comps; do targets+=("uvbus_${c}_test"); done
cmake --build "$BUILD" -j"$jobs" --target "${targets[@]}"

failed=0
for t in "${targets[@]}"; do
  log="$BUILD/valgrind-$t.log"
  start=$(date +%s)
  rc=0
  timeout --signal=KILL "$limit" valgrind --tool=memcheck --error-exitcode=1 --leak-check=full \
    --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
    --track-origins=yes --num-callers=30 --log-file="$log" \
    "$BUILD/$t" --gtest_brief=1 --gtest_filter="$filter" >"$BUILD/valgrind-$t.out" 2>&1 || rc=$?
  secs=$(( $(date +%s) - start ))
  summary=$(grep -E 'ERROR SUMMARY' "$log" | tail -1 | sed 's/^==[0-9]*== //')
  tests=$(grep -E '^\[  (PASSED|FAILED)  \]' "$BUILD/valgrind-$t.out" | tr '\n' ' ')
  if [ "$rc" -ne 0 ]; then
    echo "valgrind: $t FAILED (exit $rc after ${secs}s): $summary $tests"
    tail -40 "$log"
    tail -20 "$BUILD/valgrind-$t.out"
    failed=1
  else
    echo "valgrind: $t ok in ${secs}s: $summary $tests"
  fi
done
exit $failed
