#!/usr/bin/env bash
# Renders docs/cluster-scale.png from benchmark/run_world_scale.sh output (its JSON lines): the
# time until every directory is complete and etcd's CPU per second in steady state (keep-alives),
# against the number of node processes.
# Usage: benchmark/chart_world_scale.sh RUN_WORLD_SCALE_OUTPUT [OUT.png]   (needs gnuplot, python3)
set -euo pipefail
in=$1
out=${2:-docs/cluster-scale.png}
dat=$(mktemp)
trap 'rm -f "$dat"' EXIT
python3 - "$in" >"$dat" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith('{"bench":"world_scale"'):
        j = json.loads(line)
        print(j["nodes"], j["complete_s"], j["etcd_cpu_ms_s"], j["etcd_rss_mib"])
PY
gnuplot <<GP
set terminal pngcairo size 900,480 font ",10"
set output "$out"
set title "Discovery on one etcd: N node processes on 2 cores (TTL 3 s)"
set xlabel "node processes"
set ylabel "seconds until every directory holds all N"
set y2label "etcd CPU, ms per second (steady) / RSS MiB"
set ytics nomirror
set y2tics
set key left top
set grid
plot "$dat" using 1:2 with linespoints lw 2 title "all directories complete (s)", \
     "$dat" using 1:3 axes x1y2 with linespoints lw 2 title "etcd CPU steady (ms/s)", \
     "$dat" using 1:4 axes x1y2 with linespoints lw 2 title "etcd RSS (MiB)"
GP
echo "wrote $out"
