#!/usr/bin/env bash
# Installs uvbus into a temporary prefix and builds + runs test/consumer against it, through the
# CMake package config and through pkg-config.
#   scripts/consumer.sh [BUILD_DIR]
# BUILD_DIR: a Release tree that has built the library and tools (CI's build-ci-release) is
# installed as it is; without it the library is configured and built here first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/deps.sh
# Inside the clone (and removed afterwards): a compile cache whose base directory is the clone
# (.ci/run) finds this build's objects again on the next run.
work=$PWD/build-consumer
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
build=${1:-}
if [ -z "$build" ]; then
  build=$work/build
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DUVBUS_WERROR=ON \
    -DUVBUS_BUILD_TESTS=OFF -DUVBUS_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$build" -j"$(nproc)" >/dev/null
fi
cmake --install "$build" --prefix "$work/prefix" >/dev/null
PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig:$work/prefix/lib/x86_64-linux-gnu/pkgconfig" \
  cmake -S test/consumer -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"
"$work/consumer/consumer_pc"
