#!/usr/bin/env bash
# uvbus against the machine's raw baseline, measured in the same sitting: ROUNDS alternating rounds
# of (baseline, stream, shm, bus), then medians per case and ratios, as a markdown table, plus the
# data file for benchmark/chart.sh; throughput rows also give uvbus's CPU ns per message (sender /
# receiver, getrusage user + system, medians). Needs python3 and the machine's raw baseline
# script, given as BASELINE=/path/to/run.sh (the raw coalesced and ring programs it compares with).
#
#   benchmark/compare.sh BUILD_DIR [OUT_DIR]     (default OUT_DIR /tmp/uvbus-compare)
#   ROUNDS=3 SECONDS_PER_CASE=3 PARTS="stream shm bus"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:?usage: compare.sh BUILD_DIR [OUT_DIR]}
OUT=${2:-/tmp/uvbus-compare}
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_CASE:-3}
PARTS=${PARTS:-"stream shm bus"}
BASELINE=${BASELINE:?set BASELINE=/path/to/run.sh, the raw baseline script of this machine}
mkdir -p "$OUT"
: >"$OUT/all.jsonl"
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r/$ROUNDS, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  {
    DURATION=$SECS DISTS="small large" CASES='^(tcp-coalesced|unix-coalesced|shm-ring)$' bash "$BASELINE"
    DURATION=$SECS DISTS=small CASES='^tcp-naive$' bash "$BASELINE"
    TCP_HOST=::1 DURATION=$SECS DISTS="small large" CASES='^tcp-coalesced$' bash "$BASELINE"
    ROUND_TRIPS=100000 CASES='pingpong' bash "$BASELINE"
  } 2>/dev/null | grep '^{"baseline"' | sed "s/}\$/,\"round\":$r}/" >>"$OUT/all.jsonl" || true
  for part in $PARTS; do
    SECONDS_PER_CASE=$SECS ROUND_TRIPS=100000 bash "benchmark/run_$part.sh" "$BUILD" 2>/dev/null |
      grep '^{' | sed "s/}\$/,\"part\":\"$part\",\"round\":$r}/" >>"$OUT/all.jsonl" || true
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys, collections
out = sys.argv[1]
rows = [json.loads(l) for l in open(out + "/all.jsonl") if l.strip()]
def key_of(j):
    if "baseline" in j:
        k = j["baseline"] + ("/" + j["dist"] if "dist" in j else "")
        if j.get("host") == "::1": k += "/ipv6"
        return "base:" + k
    return j.get("part", "?") + ":" + j.get("case", j.get("bench", "?"))
by_round = collections.defaultdict(dict)
for j in rows:
    by_round[j["round"]][key_of(j)] = j
def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None
def series(key, field):
    return [by_round[r][key].get(field) for r in sorted(by_round) if key in by_round[r]]
# (label, uvbus key, baseline key, kind)  kind: t = throughput, l = latency
cases = [
  ("stream ipv4 8-128 B", "stream:ipv4/small", "base:tcp-coalesced/small", "t"),
  ("stream ipv4 8-128 B --no-merge", "stream:ipv4/small/no-merge", "base:tcp-coalesced/small", "t"),
  ("stream ipv6 8-128 B", "stream:ipv6/small", "base:tcp-coalesced/small/ipv6", "t"),
  ("stream unix 8-128 B", "stream:unix/small", "base:unix-coalesced/small", "t"),
  ("stream ipv4 8-16384 B", "stream:ipv4/large", "base:tcp-coalesced/large", "t"),
  ("stream ipv6 8-16384 B", "stream:ipv6/large", "base:tcp-coalesced/large/ipv6", "t"),
  ("stream unix 8-16384 B", "stream:unix/large", "base:unix-coalesced/large", "t"),
  ("shm 8-128 B, 1 writer", "shm:small/1w", "base:shm-ring/small", "t"),
  ("shm 8-128 B, 2 writers", "shm:small/2w", "base:shm-ring/small", "t"),
  ("shm 8-16384 B, 1 writer", "shm:large/1w", "base:shm-ring/large", "t"),
  ("shm 8-16384 B, 2 writers", "shm:large/2w", "base:shm-ring/large", "t"),
  ("bus node tcp 8-128 B", "bus:tcp/node", "bus:tcp/raw-stream", "t"),
  ("bus node tcp via parent", "bus:tcp/node-relay", "bus:tcp/raw-stream", "t"),
  ("bus node shm 8-128 B", "bus:shm/node", "bus:shm/raw-shm", "t"),
  ("bus node shm via parent", "bus:shm/node-relay", "bus:shm/raw-shm", "t"),
  ("latency tcp 64 B", "stream:ipv4/pingpong64", "base:tcp-pingpong", "l"),
  ("latency unix 64 B", "stream:unix/pingpong64", "base:unix-pingpong", "l"),
  ("latency shm 64 B (busy-poll)", "shm:pingpong64/poll", "base:shm-pingpong", "l"),
  ("latency shm 64 B (libuv loop)", "shm:pingpong64/uv", "base:shm-pingpong", "l"),
  ("latency bus node tcp 64 B", "bus:tcp/node-pingpong64", "base:tcp-pingpong", "l"),
  ("latency bus node shm 64 B", "bus:shm/node-pingpong64", "base:shm-pingpong", "l"),
]
md = ["| case | uvbus | reference, same sitting | ratio per round | median ratio | CPU ns/msg snd / rcv |",
      "|---|---:|---:|---|---:|---:|"]
def cpu_cell(uk):
    s, r = med(series(uk, "send_cpu_ns_per_msg")), med(series(uk, "cpu_ns_per_msg"))
    return f"{s:.0f} / {r:.0f}" if s is not None and r is not None else "-"
chart = []
for label, uk, bk, kind in cases:
    if not series(uk, "msgs_per_s" if kind == "t" else "p50_us"):
        continue
    if kind == "t":
        um, bm = series(uk, "msgs_per_s"), series(bk, "msgs_per_s")
        ub, bb = series(uk, "mb_per_s"), series(bk, "mb_per_s")
        large = "16384" in label
        f, unit = ("mb_per_s", "MB/s") if large else ("msgs_per_s", "msg/s")
        us, bs = (ub, bb) if large else (um, bm)
    else:
        f, unit = "p50_us", "µs p50"
        us, bs = series(uk, f), series(bk, f)
    ratios = []
    for r in sorted(by_round):
        if uk in by_round[r] and bk in by_round[r]:
            a, b = by_round[r][uk].get(f), by_round[r][bk].get(f)
            if a and b: ratios.append(a / b)
    fmt = (lambda v: f"{v/1e6:.2f} M {unit}") if unit == "msg/s" else (lambda v: f"{v:.1f} {unit}" if unit == "MB/s" else f"{v:.2f} {unit}")
    uvm, bvm = med(us), med(bs)
    cpu = cpu_cell(uk) if kind == "t" else "-"
    md.append(f"| {label} | {fmt(uvm) if uvm else '-'} | {fmt(bvm) if bvm else '-'} | "
              + " / ".join(f"{x:.2f}" for x in ratios) + f" | **{med(ratios):.2f}** | {cpu} |" if ratios else f"| {label} | {fmt(uvm)} | - | - | - | {cpu} |")
    if kind == "t" and bk.startswith("base:") and "no-merge" not in label:
        chart.append(f"{label.replace(' ', '_').replace(',', '')} {med(um) or 0:.0f} {med(bm) or 0:.0f} {med(ub) or 0:.1f} {med(bb) or 0:.1f}")
open(out + "/table.md", "w").write("\n".join(md) + "\n")
open(out + "/chart.dat", "w").write("\n".join(chart) + "\n")
print("\n".join(md))
PY
echo "# data: $OUT/all.jsonl  table: $OUT/table.md  chart data: $OUT/chart.dat" >&2
