#!/usr/bin/env bash
# clang-format every C++ file of the project: `--check` only reports (CI), otherwise rewrites.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mapfile -t files < <(git ls-files -- 'include/*.h' 'src/*.h' 'src/*.cpp' 'test/*.h' 'test/*.cpp' \
  'benchmark/*.h' 'benchmark/*.cpp' 'tools/*.h' 'tools/*.cpp' 'examples/*.cpp' 'examples/*.h')
if [ "${1:-}" = --check ]; then
  clang-format --dry-run -Werror "${files[@]}"
  echo "clang-format: ${#files[@]} files clean"
else
  clang-format -i "${files[@]}"
fi
