#!/usr/bin/env bash
# clang-tidy (checks in .clang-tidy) over the project's sources; exits non-zero on any warning.
# -std=c++17 is passed explicitly: g++ 12 defaults to gnu++17, so CMake writes no -std flag into
# compile_commands.json and clang would otherwise parse the sources as its own default.
#   scripts/tidy.sh [BUILD_DIR]   (a configured build dir with compile_commands.json; default build-tidy)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build-tidy}
if [ ! -f "$BUILD/compile_commands.json" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug >/dev/null
fi
mapfile -t files < <(git ls-files -- 'src/*.cpp' 'test/*.cpp' 'benchmark/*.cpp' 'tools/*.cpp' 'examples/*.cpp' |
  grep -v '^test/consumer/' | grep -v '^test/fuzz/')
out=$(printf '%s\n' "${files[@]}" | xargs -P"$(nproc)" -n4 clang-tidy -p "$BUILD" --quiet --extra-arg=-std=c++17 2>/dev/null |
  grep -E 'warning:|error:' || true)
if [ -n "$out" ]; then
  echo "$out"
  echo "clang-tidy: $(echo "$out" | wc -l) findings" >&2
  exit 1
fi
echo "clang-tidy: ${#files[@]} files clean"
