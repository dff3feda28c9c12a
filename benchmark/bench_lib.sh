# Shared by benchmark/run_*.sh (sourced, not run). After `source bench_lib.sh`, call
#   bench_setup TAG BINARY...
# with BUILD set: checks that $BUILD/BINARY exist, reads the common environment
# (SECONDS_PER_CASE -> SECS, CASES, SEND_CPU, RECV_CPU, PIN), sets ON_SEND / ON_RECV to the taskset
# prefixes (sender on cpu 0, receiver on cpu 1, as the baseline), makes TMP (removed at exit), and
# empties the JSON, ROWS and LAT arrays.

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
  LAT=()
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

# wait_ready NAME WHAT FILE OUT TRIES PID...: waits up to TRIES x 50 ms for a started process to
# write FILE; if it does not, prints "NAME: WHAT did not start" and OUT (its output) to stderr,
# kills the PIDs and fails.
wait_ready() {
  local name=$1 what=$2 file=$3 out=$4 tries=$5
  shift 5
  for _ in $(seq "$tries"); do [ -f "$file" ] && break; sleep 0.05; done
  [ ! -f "$file" ] || return 0
  echo "$name: $what did not start" >&2
  cat "$out" >&2
  kill "$@" 2>/dev/null || true
  return 1
}

# recv_json NAME OUT: sets J to the last JSON line of a receiver's output OUT; if there is none,
# prints "NAME: no result" and OUT to stderr and fails.
recv_json() {
  J=$(grep '^{"bench"' "$2" | tail -1 || true)
  [ -z "$J" ] || return 0
  echo "$1: no result" >&2
  cat "$2" >&2
  return 1
}

# add_latency NAME WIDTH LINE: a ping-pong benchmark's JSON LINE goes to JSON (with "case":NAME)
# and its p50/p90/p99/p99.9/max row, NAME padded to WIDTH, to LAT.
add_latency() {
  local name=$1 width=$2 line=$3
  JSON+=("${line%\}},\"case\":\"$name\"}")
  LAT+=("$(printf '%-*s %8s %8s %8s %8s %8s' "$width" "$name" "$(json_field "$line" p50_us)" \
    "$(json_field "$line" p90_us)" "$(json_field "$line" p99_us)" "$(json_field "$line" p999_us)" \
    "$(json_field "$line" max_us)")")
}

# print_results WIDTH: after the caller's header line, the ROWS, then the latency table (when LAT
# has rows; names padded to WIDTH), then every JSON line.
print_results() {
  local r
  for r in "${ROWS[@]}"; do echo "$r"; done
  if [ ${#LAT[@]} -gt 0 ]; then
    printf '%-*s %8s %8s %8s %8s %8s\n' "$1" latency p50_us p90_us p99_us p99.9_us max_us
    for r in "${LAT[@]}"; do echo "$r"; done
  fi
  for r in "${JSON[@]}"; do echo "$r"; done
}
