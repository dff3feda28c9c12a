#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan, coverage on the library objects too) and runs
# each for a bounded time; fails on any finding (crash, sanitizer report, leak, timeout, OOM).
#
#   scripts/fuzz.sh [SECONDS_TOTAL]      default 60, split evenly across the targets, which run
#                                        two at a time on two or more cores (so about half that
#                                        long in wall-clock time)
#
# Environment:
#   BUILD=dir           build directory (default build-fuzz; configured here if needed)
#   FUZZ_TARGETS="a b"  run only these targets (names as built: fuzz_frame_decoder ...)
#   FUZZ_CORPUS_DIR=d   keep each target's grown corpus in d/<target> across runs (long runs);
#                       by default a temporary directory is used and the checked-in seeds under
#                       test/fuzz/corpus/<target> are only read, never modified
#   FUZZ_ARTIFACTS=d    where crashing inputs are written (default $BUILD/fuzz-artifacts)
#
# Each target prints one summary line: executions, exec/s, and libFuzzer's final cov:/ft: figures.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
total=${1:-60}
BUILD=${BUILD:-build-fuzz}
jobs=$(nproc)
[ "$jobs" -gt 2 ] && jobs=2

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DUVBUS_BUILD_FUZZERS=ON -DUVBUS_BUILD_TESTS=OFF -DUVBUS_BUILD_BENCHMARKS=OFF >/dev/null
fi
cmake --build "$BUILD" -j"$jobs" --target uvbus_fuzzers

if [ -n "${FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  mapfile -t targets < <(find "$BUILD" -maxdepth 1 -type f -executable -name 'fuzz_*' -printf '%f\n' | sort)
fi
[ "${#targets[@]}" -gt 0 ] || { echo "fuzz.sh: no fuzz targets built" >&2; exit 1; }
per=$(( total / ${#targets[@]} ))
[ "$per" -lt 5 ] && per=5

artifacts=${FUZZ_ARTIFACTS:-$BUILD/fuzz-artifacts}
mkdir -p "$artifacts"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# A leak or a UBSan report is a finding; so is one input running for over 10 s (a hang).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# run_target T: one target for $per seconds; its log and exit code go to $scratch/T.log / T.rc.
run_target() {
  local t=$1 seeds=test/fuzz/corpus/$1 work rc=0
  if [ -n "${FUZZ_CORPUS_DIR:-}" ]; then
    work=$FUZZ_CORPUS_DIR/$t
  else
    work=$scratch/$t
  fi
  # Findings of earlier runs were reported then; start each run with an empty artifact directory
  # so that a stale crash file cannot fail a clean run.
  rm -rf "${artifacts:?}/$t"
  mkdir -p "$work" "$artifacts/$t"
  local dirs=("$work")
  [ -d "$seeds" ] && dirs+=("$seeds")
  "$BUILD/$t" -max_total_time="$per" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$t/" "${dirs[@]}" >"$scratch/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$scratch/$t.rc"
}

# The targets run $jobs at a time (one a core, at most two), each for $per seconds; the summary
# lists them in order once all have ended.
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_target "$t" &
  running=$((running + 1))
done
wait

failed=0
printf '%-22s %8s %12s %10s %8s %8s %s\n' target seconds execs exec/s cov ft result
for t in "${targets[@]}"; do
  log=$scratch/$t.log
  rc=$(cat "$scratch/$t.rc" 2>/dev/null || echo "no exit code")
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
  found=$(find "$artifacts/$t" -type f | wc -l)
  if [ "$rc" != 0 ] || [ "$found" -ne 0 ]; then
    result="FINDING (exit $rc, $found artifact(s) in $artifacts/$t)"
    failed=1
  else
    result=ok
  fi
  printf '%-22s %8s %12s %10s %8s %8s %s\n' "$t" "$per" "${execs:-?}" "${rate:-?}" "${cov:-?}" \
    "${ft:-?}" "$result"
  if [ "$result" != ok ]; then
    echo "---- $t log (last 60 lines) ----"
    tail -60 "$log"
  fi
done
exit $failed
