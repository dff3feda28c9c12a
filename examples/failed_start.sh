#!/usr/bin/env bash
# The hot-upgrade example's roles when their node's start() fails (a URL of no known scheme): each
# exits 1 with the refusal printed, after running the loop until the node's handles have closed
# (node.h: a node refused for its config included); a handle left open makes it say so, exit 1.
#   examples/failed_start.sh PATH_TO_uvbus_example_hot_upgrade
set -uo pipefail
BIN=${1:?usage: failed_start.sh PATH_TO_uvbus_example_hot_upgrade}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fail=0
check() {  # check ROLE ARGS...: exit 1, "ROLE: start:" on stderr, no handle left open
  local role=$1
  "$BIN" "$@" >"$DIR/out" 2>"$DIR/err"
  local rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q "^$role: start: unsupported_scheme" "$DIR/err" ||
     grep -q "open handles" "$DIR/err"; then
    echo "failed_start.sh: $role: exit $rc, stderr:" >&2
    cat "$DIR/err" >&2
    fail=1
  fi
}
check root "$DIR/url" nonsense://x
check logic nonsense://x "uvbus-failed-start-$$" "$DIR/state" "$DIR/log"
check sender nonsense://x 1
exit $fail
