#!/usr/bin/env bash
# clang-tidy (checks in .clang-tidy) over the project's sources; exits non-zero on any warning.
# scripts/tidy.py runs it, one file per core, and reuses the clean verdicts of files whose
# preprocessed text is unchanged (TIDY_CACHE=off runs every file).
# -std=c++17 is passed explicitly: g++ 12 defaults to gnu++17, so CMake writes no -std flag into
# compile_commands.json and clang would otherwise parse the sources as its own default.
#   scripts/tidy.sh [BUILD_DIR]   (a configured build dir with compile_commands.json; default build-tidy)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build-tidy}
if [ ! -f "$BUILD/compile_commands.json" ]; then
  # Without the tests' precompiled header: every file is parsed with its own includes only,
  # and each test file on its own (no unity build: compile_commands.json must name every file).
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON \
    -DUVBUS_UNITY_TESTS=OFF >/dev/null
fi
mapfile -t files < <(git ls-files -- 'src/*.cpp' 'test/*.cpp' 'benchmark/*.cpp' 'tools/*.cpp' 'examples/*.cpp' |
  grep -v '^test/consumer/' | grep -v '^test/fuzz/')
python3 scripts/tidy.py "$BUILD" "${files[@]}"
