#!/usr/bin/env bash
# Builds the core tests without sanitizers and runs them under valgrind memcheck: any invalid
# access, use of uninitialised memory or leak (definite or indirect) fails the run.
#
#   scripts/valgrind.sh              the core tests
# Environment:
#   BUILD=dir                 build directory (default build-valgrind)
#   VALGRIND_TESTS="core shm" which components' test binaries to run (default core)
#   VALGRIND_TIMEOUT=s        wall-clock bound per shard (default 600)
#   VALGRIND_GTEST_FILTER=... googletest's filter (default: all but two exhaustive hash tests)
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

# One shard of a binary's tests under memcheck (googletest's own sharding: shard i of n runs
# every n-th test): returns memcheck's or the tests' failure; its logs are $BUILD/valgrind-$t.$i.*.
run_shard() {
  local t=$1 i=$2 n=$3
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout --signal=KILL "$limit" \
    valgrind --tool=memcheck --error-exitcode=1 --leak-check=full \
    --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
    --track-origins=yes --num-callers=30 --log-file="$BUILD/valgrind-$t.$i.log" \
    "$BUILD/$t" --gtest_brief=1 --gtest_filter="$filter" >"$BUILD/valgrind-$t.$i.out" 2>&1
}

# valgrind runs a process's threads one at a time, so each binary runs as several shards at once:
# two per core balance the slow tests better than one (core tests on 2 cores: 173 s in one
# process, 117 s in two shards, 95 s in four).
shards=$(( 2 * $(nproc) ))
[ "$shards" -gt 8 ] && shards=8
failed=0
for t in "${targets[@]}"; do
  start=$(date +%s)
  rm -f "$BUILD/valgrind-$t".*  # no stale log can speak for this run
  pids=()
  for ((i = 0; i < shards; i++)); do
    run_shard "$t" "$i" "$shards" &
    pids+=($!)
  done
  for ((i = 0; i < shards; i++)); do
    rc=0
    wait "${pids[$i]}" || rc=$?
    log="$BUILD/valgrind-$t.$i.log"
    out="$BUILD/valgrind-$t.$i.out"
    summary=$(grep -sE 'ERROR SUMMARY' "$log" | tail -1 | sed 's/^==[0-9]*== //' || true)
    tests=$(grep -sE '^\[  (PASSED|FAILED)  \]' "$out" | tr '\n' ' ' || true)
    if [ "$rc" -ne 0 ]; then
      echo "valgrind: $t shard $((i + 1))/$shards FAILED (exit $rc): $summary $tests"
      tail -40 "$log" 2>/dev/null || true
      tail -20 "$out" 2>/dev/null || true
      failed=1
    else
      echo "valgrind: $t shard $((i + 1))/$shards ok: $summary $tests"
    fi
  done
  echo "valgrind: $t took $(( $(date +%s) - start ))s"
done
exit $failed
