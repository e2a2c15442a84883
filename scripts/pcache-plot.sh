#!/usr/bin/env bash
# Usage: scripts/pcache-plot.sh EXPERIMENT.csv [OUT.png]
#
# Draws the paging experiment as the papers do (LegoOS, Fastswap,
# Infiniswap): run time normalised to the run with all of the working set
# in the local cache, against the local fraction in percent, one line per
# workload; one panel per number of memory nodes. Each point is the best
# run; a bar from it up to the worst run (the CSV's time_max_us, when it
# has one) shows the spread, the workloads' bars set a little apart. Reads the CSV that
# `pcache experiment` prints (collected by run-qemu.sh as
# nodeN-pcache-experiment.csv) and writes a PNG (default: beside the CSV,
# pcache-experiment.png) and an SVG of the same name. Uses gnuplot
# (Debian's gnuplot-nox, installed here when missing and root).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"

[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 EXPERIMENT.csv [OUT.png]" >&2; exit 2; }
csv=$1
[ -f "$csv" ] || { echo "$0: no such file: $csv" >&2; exit 1; }
out=${2:-$(dirname "$csv")/pcache-experiment.png}
svg=${out%.png}.svg
ensure_pkgs gnuplot:gnuplot-nox

head -1 "$csv" | grep -q '^workload,nodes,replicas,readahead,local_pct,' ||
    { echo "$0: $csv is not a pcache-experiment CSV" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One data file per (nodes, workload): local_pct norm_time, by fraction.
awk -F, -v dir="$tmp" 'NR > 1 {
        # seq with read-ahead K is its own line, "seq+raK".
        w = $1 ($4 > 0 ? "+ra" $4 : "")
        f = dir "/" $2 "-" w ".dat"
        # The worst run, normalised as the best is (time_max_us, column 24).
        worst = (NF >= 24 && $8 > 0) ? $10 * $24 / $8 : $10
        print $5, $10, worst > f
        nodes[$2] = 1; work[w] = 1
        ws = $6
        if (worst + 0 > ymax) ymax = worst + 0
    }
    END {
        for (n in nodes) printf "%s ", n > (dir "/nodes")
        for (w in work) printf "%s ", w > (dir "/workloads")
        print ws > (dir "/ws")
        print (ymax > 1 ? ymax * 1.3 : 2) > (dir "/ymax")
    }' "$csv"
for f in "$tmp"/*.dat; do sort -n -k1,1 "$f" -o "$f"; done
nodes=$(tr ' ' '\n' < "$tmp/nodes" | sort -n | tr '\n' ' ')
# The experiment's order: seq, gups, sort, kv (others after).
workloads=$(tr ' ' '\n' < "$tmp/workloads" | awk 'NF' |
    awk '{ o = index("seq gups sort kv ", $1 " "); print (o ? o : 50), $1 }' | sort -k1,1n -k2 | cut -d' ' -f2 | tr '\n' ' ')
ws_kib=$(( $(cat "$tmp/ws") * 4 ))
ymax=$(cat "$tmp/ymax")
npanels=$(wc -w <<<"$nodes")

plot_cmds() { # terminal line
    echo "$1"
    echo "set output '$2'"
    echo "set multiplot layout 1,$npanels title 'Remote paging (pcache) under QEMU TCG, emulated ConnectX-3: working set ${ws_kib} KiB' font ',12'"
    echo "set xlabel 'local memory (% of the working set)'"
    echo "set ylabel 'run time, normalised to 100% local'"
    echo "set xrange [105:0]"
    echo "set xtics (100, 75, 50, 25, 10)"
    echo "set logscale y"
    echo "set yrange [0.8:$ymax]"
    echo "set grid"
    echo "set key top left"
    for n in $nodes; do
        echo "set title '$n memory node$([ "$n" = 1 ] || echo s)'"
        local first=1 line="plot " c=0
        for w in $workloads; do
            c=$((c + 1))
            [ -f "$tmp/$n-$w.dat" ] || continue
            [ $first = 1 ] || line+=", "
            first=0
            # The same colour for a workload in every panel; its points
            # and bars moved by a fraction of a percent from the others'.
            local dx
            dx=$(awk -v c=$c 'BEGIN { printf "%.1f", (c - 3) * 0.9 }')
            line+="'$tmp/$n-$w.dat' using (\$1+$dx):2 with linespoints lw 2 pt 7 lc $c title '$w'"
            line+=", '$tmp/$n-$w.dat' using (\$1+$dx):2:2:3 with yerrorbars lw 1 ps 0 lc $c notitle"
        done
        echo "$line"
    done
    echo "unset multiplot"
}

plot_cmds "set terminal pngcairo size $((560 * npanels)),480 font ',10'" "$out" | gnuplot
plot_cmds "set terminal svg size $((560 * npanels)),480 font ',10' dynamic" "$svg" | gnuplot
echo "$out"
echo "$svg"
