#!/usr/bin/env bash
# Discovery at scale with real processes: one etcd, one gateway and N-1 logic nodes, each a
# separate uvbus_example_world process (a full bus node: listener, discovery, parent chosen by
# type, registration), started at once. Prints one JSON line per N:
#   complete_s      time until every process's directory holds all N nodes
#   etcd_cpu_s      etcd's CPU time (user+system) from the first start until complete
#   etcd_cpu_ms_s   etcd's CPU per second afterwards (keep-alives, the gateway's heartbeats)
#   etcd_rss_mib    etcd's RSS when complete
#   node_rss_kib    the median RSS of the logic processes when complete
#   gone_s          after kill -9 of one logic node: time until every other directory dropped it
#
#   bash benchmark/run_world_scale.sh [BUILD_DIR] [N...]     (default build-rel, N = 10 50 100 200)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build-rel}
shift || true
SIZES=${*:-10 50 100 200}
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DUVBUS_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$BUILD" --target uvbus_example_world >/dev/null
BIN=$(find "$BUILD" -name uvbus_example_world -type f -perm -u+x | head -1)
DIR=$(mktemp -d /tmp/uvbus-scale-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_ms() { awk '{print int(($14 + $15) * 1000 / '"$(getconf CLK_TCK)"')}' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
now_ms() { date +%s%3N; }

run_one() {
  local n=$1 d="$DIR/$1"
  mkdir -p "$d"
  local cp pp etcd
  cp=$(free_port)
  pp=$(free_port)
  etcd=http://127.0.0.1:$cp
  /usr/bin/etcd --name s --data-dir "$d/etcd" --log-level error --listen-client-urls "$etcd" \
    --advertise-client-urls "$etcd" --listen-peer-urls "http://127.0.0.1:$pp" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "s=http://127.0.0.1:$pp" >"$d/etcd.log" 2>&1 &
  local etcd_pid=$!
  PIDS=("$etcd_pid")
  for _ in $(seq 100); do curl -sf "$etcd/health" >/dev/null 2>&1 && break; sleep 0.1; done
  local cpu0 t0
  cpu0=$(cpu_ms "$etcd_pid")
  t0=$(now_ms)
  "$BIN" gateway 1 "$etcd" >"$d/gw.log" 2>&1 &
  PIDS+=($!)
  local i
  for i in $(seq 1 $((n - 1))); do
    "$BIN" logic "$(printf '%x' $((0x10000 + i)))" "$etcd" >"$d/l$i.log" 2>&1 &
    PIDS+=($!)
  done
  local want="DIR $n nodes" deadline=$(($(date +%s) + 300)) done_n=0
  while :; do
    done_n=$(grep -l "$want" "$d"/gw.log "$d"/l*.log 2>/dev/null | wc -l || true)
    [ "$done_n" -ge "$n" ] && break
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "scale: N=$n: only $done_n complete" >&2; return 1; fi
    sleep 0.05
  done
  local t1 cpu1 rss
  t1=$(now_ms)
  cpu1=$(cpu_ms "$etcd_pid")
  rss=$(rss_kib "$etcd_pid")
  local node_rss
  node_rss=$(for p in "${PIDS[@]:2}"; do rss_kib "$p"; done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  sleep 5
  local cpu2
  cpu2=$(cpu_ms "$etcd_pid")
  # kill -9 the last logic node; wait until every other process's directory lost it
  local victim=${PIDS[-1]} t2 gone=0
  { kill -9 "$victim" && wait "$victim"; } 2>/dev/null || true
  t2=$(now_ms)
  local want2="DIR $((n - 1)) nodes"
  deadline=$(($(date +%s) + 60))
  while :; do
    gone=$(grep -l "$want2" "$d"/gw.log "$d"/l*.log 2>/dev/null | wc -l || true)
    [ "$gone" -ge $((n - 1)) ] && break
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "scale: N=$n: the killed node stayed" >&2; return 1; fi
    sleep 0.05
  done
  local t3
  t3=$(now_ms)
  printf '{"bench":"world_scale","nodes":%d,"complete_s":%.2f,"etcd_cpu_s":%.2f,"etcd_cpu_ms_s":%d,"etcd_rss_mib":%d,"node_rss_kib":%d,"gone_s":%.2f,"load":"%s"}\n' \
    "$n" "$(awk "BEGIN{print ($t1 - $t0) / 1000}")" "$(awk "BEGIN{print ($cpu1 - $cpu0) / 1000}")" \
    $(((cpu2 - cpu1) / 5)) $((rss / 1024)) "$node_rss" "$(awk "BEGIN{print ($t3 - $t2) / 1000}")" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
  rm -rf "$d"
}

for n in $SIZES; do run_one "$n"; done
