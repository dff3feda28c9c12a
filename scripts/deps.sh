#!/usr/bin/env bash
# Installs the Debian 12 packages uvbus needs, only those missing. Needs root (or sudo).
#   scripts/deps.sh          build, test and benchmark dependencies (libmicrohttpd serves the
#                            metrics endpoint, libcurl is the uvbus tool's HTTP client; the tests
#                            scrape with curl, validate with promtool (prometheus) and drive
#                            `uvbus top` in tmux; python3 parses the tools' --json output;
#                            liblz4 and libzstd are the link compression codecs; etcd-server
#                            and nlohmann-json3-dev are discovery's store and JSON parser;
#                            locales gives the metrics test a comma-decimal locale to build)
#   scripts/deps.sh ci       plus what CI's extra jobs use (clang, clang-format, valgrind, ...)
set -euo pipefail
pkgs=(git ca-certificates g++ cmake ninja-build pkg-config libuv1-dev libgtest-dev libgmock-dev
      libbenchmark-dev libssl-dev util-linux procps gnuplot-nox
      libmicrohttpd-dev libcurl4-openssl-dev curl prometheus tmux python3 liblz4-dev libzstd-dev
      etcd-server nlohmann-json3-dev locales)
if [ "${1:-}" = ci ]; then
  pkgs+=(clang clang-format clang-tidy libclang-rt-14-dev valgrind iproute2 ccache)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# CI's clang-tidy: clang-tidy-22 from Debian 12's security archive when it is there. From LLVM 21
# on, clang-tidy skips the declarations of system headers, which makes it about four times faster
# on this project (a test file: 24 s with clang-tidy 14, 5.7 s with 22). Without it the packaged
# clang-tidy (14) runs; scripts/tidy.py takes the newest installed.
newer_tidy=()
if [ "${1:-}" = ci ] && ! dpkg-query -W -f='${Status}' clang-tidy-22 2>/dev/null | grep -q "install ok installed"; then
  newer_tidy=(clang-tidy-22)
fi
[ ${#missing[@]} -eq 0 ] && [ ${#newer_tidy[@]} -eq 0 ] && exit 0
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
if [ ${#missing[@]} -ne 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#newer_tidy[@]} -ne 0 ]; then
  $SUDO apt-get install -y -q --no-install-recommends "${newer_tidy[@]}" >/dev/null ||
    echo "deps: ${newer_tidy[*]} is not in this machine's archive; clang-tidy $(clang-tidy --version | sed -n 's/.*version \([0-9]*\).*/\1/p') will run (slower)" >&2
fi
