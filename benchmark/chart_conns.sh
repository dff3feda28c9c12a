#!/usr/bin/env bash
# Renders docs/conns.png from benchmark/run_conns.sh output (its JSON lines): for the 1 msg/s
# cases, the receiver's memory per connection (RSS and heap, after the measured interval) and its
# CPU % against the number of connections.
# Usage: benchmark/chart_conns.sh RUN_CONNS_OUTPUT [OUT.png]   (needs gnuplot and python3)
set -euo pipefail
in=$1
out=${2:-docs/conns.png}
dat=$(mktemp)
trap 'rm -f "$dat"' EXIT
python3 - "$in" >"$dat" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith('{"bench":"conns"'):
        continue
    j = json.loads(line)
    if j.get("case", "").startswith("rate1/"):
        print(j["connections"], j["rss_active_b_per_conn"], j["heap_active_b_per_conn"], j["cpu_pct"],
              j["cpu_ns_per_msg"] / 1000.0)
PY
gnuplot <<GP
set terminal pngcairo size 1200,480 font "DejaVu Sans,10" noenhanced
set output "$out"
set multiplot layout 1,2 title "uvbus_bench_conns: one stream-channel receiver, every connection sending 1 msg/s (64-320 B)"
set grid
set key top right
set xlabel "connections"
set yrange [0:*]
set title "receiver memory per connection (bytes)"
plot "$dat" using 1:2 with linespoints title "RSS" lw 2, "" using 1:3 with linespoints title "heap in use" lw 2
set title "receiver CPU"
set ylabel "% of a core"
set y2label "us per message"
set y2tics
set y2range [0:*]
plot "$dat" using 1:4 with linespoints title "CPU %" lw 2, "" using 1:5 axes x1y2 with linespoints title "CPU us/msg" lw 2
unset multiplot
GP
echo "chart: $out"
