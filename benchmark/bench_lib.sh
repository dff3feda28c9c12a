# Shared by benchmark/run_*.sh (sourced, not run). After `source bench_lib.sh`, call
#   bench_setup TAG BINARY...
# with BUILD set: checks that $BUILD/BINARY exist, reads the common environment
# (SECONDS_PER_CASE -> SECS, CASES, SEND_CPU, RECV_CPU, PIN), sets ON_SEND / ON_RECV to the taskset
# prefixes (sender on cpu 0, receiver on cpu 1, as the baseline), makes TMP (removed at exit), and
# empties the JSON and ROWS arrays.

bench_setup() {
  local tag=$1 b
  shift
  SECS=${SECONDS_PER_CASE:-5}
  CASES=${CASES:-.}
  SEND_CPU=${SEND_CPU:-0}
  RECV_CPU=${RECV_CPU:-1}
  PIN=${PIN:-1}
  for b in "$@"; do
    [ -x "$BUILD/$b" ] || { echo "missing $BUILD/$b" >&2; exit 2; }
  done
  if [ "$PIN" = 1 ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    ON_SEND="taskset -c $SEND_CPU"
    ON_RECV="taskset -c $RECV_CPU"
  else
    ON_SEND=""
    ON_RECV=""
  fi
  TMP=$(mktemp -d "/tmp/uvbus-$tag-bench.XXXXXX")
  # shellcheck disable=SC2064  # TMP is fixed now
  trap "rm -rf '$TMP'" EXIT
  JSON=()
  ROWS=()
}

json_field() {  # json_field LINE KEY: the value of KEY in one flat JSON line
  sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" <<<"$1" | tr -d '"'
}

# send_cpu_ns: reads a sender's stdout and prints its CPU ns per message: the cpu_ns/msg of its
# "[send] ... msgs=N ... cpu_ns/msg=X" lines, weighted by N when several writers print one each
# ("?" when there is none).
send_cpu_ns() {
  { grep '^\[send\]' || true; } | sed -n 's/.* msgs=\([0-9]*\).* cpu_ns\/msg=\([0-9.]*\).*/\1 \2/p' |
    awk '{n += $1; c += $1 * $2} END {if (n > 0) printf "%.1f\n", c / n; else print "?"}'
}

# with_send_ns JSON NS: the JSON line with "send_cpu_ns_per_msg" added (unless NS is "?").
with_send_ns() {
  if [ "$2" = "?" ]; then echo "$1"; else echo "${1%\}},\"send_cpu_ns_per_msg\":$2}"; fi
}
