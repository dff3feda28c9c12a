#!/usr/bin/env bash
# Renders docs/benchmark.png from a whitespace table (one row per case, '#' comments allowed):
#   label  uvbus_msgs_per_s  baseline_msgs_per_s  uvbus_mb_per_s  baseline_mb_per_s
# e.g.  tcp/8-128B  12.3e6  24.1e6  840  1650
# Usage: benchmark/chart.sh DATA [OUT.png]   (needs gnuplot: Debian gnuplot-nox)
set -euo pipefail
data=$1
out=${2:-docs/benchmark.png}
gnuplot <<GP
set terminal pngcairo size 1200,520 font "DejaVu Sans,10" noenhanced
set output "$out"
set multiplot layout 1,2 title "uvbus vs the machine's raw ceiling (same sitting, 1 sender core + 1 receiver core)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set key top left
set xtics rotate by -30
set yrange [0:*]
set title "messages per second (millions)"
plot "$data" using (\$2/1e6):xtic(1) title "uvbus" lc rgb "#1f77b4", \
     "" using (\$3/1e6) title "raw baseline" lc rgb "#bbbbbb"
set title "payload MB per second"
plot "$data" using 4:xtic(1) title "uvbus" lc rgb "#ff7f0e", \
     "" using 5 title "raw baseline" lc rgb "#bbbbbb"
unset multiplot
GP
echo "chart: $out"
