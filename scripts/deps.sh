#!/usr/bin/env bash
# Installs the Debian 12 packages uvbus needs, only those missing. Needs root (or sudo).
#   scripts/deps.sh          build, test and benchmark dependencies (libmicrohttpd serves the
#                            metrics endpoint, libcurl is the uvbus tool's HTTP client; the tests
#                            scrape with curl, validate with promtool (prometheus) and drive
#                            `uvbus top` in tmux; python3 parses the tools' --json output;
#                            liblz4 and libzstd are the link compression codecs; etcd-server
#                            and nlohmann-json3-dev are discovery's store and JSON parser)
#   scripts/deps.sh ci       plus what CI's extra jobs use (clang, clang-format, valgrind, ...)
set -euo pipefail
pkgs=(git ca-certificates g++ cmake ninja-build pkg-config libuv1-dev libgtest-dev libgmock-dev
      libbenchmark-dev libssl-dev util-linux procps gnuplot-nox
      libmicrohttpd-dev libcurl4-openssl-dev curl prometheus tmux python3 liblz4-dev libzstd-dev
      etcd-server nlohmann-json3-dev)
if [ "${1:-}" = ci ]; then
  pkgs+=(clang clang-format clang-tidy libclang-rt-14-dev valgrind iproute2 ccache)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}" >&2
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
