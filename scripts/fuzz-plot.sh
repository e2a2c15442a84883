#!/usr/bin/env bash
# Usage: scripts/fuzz-plot.sh LOGDIR [OUT.png]
#
# Coverage against executions, one line per fuzz target, from the libFuzzer
# logs `scripts/fuzz.sh` keeps with FUZZ_LOGDIR=LOGDIR (one TARGET.log per
# target). Each target's edges (libFuzzer's "cov") are drawn as a
# percentage of the most it reached, over the executions on a log scale:
# a line that is flat long before its end is a target whose coverage
# stopped growing. Writes OUT.csv (target,execs,cov,ft: every line of the
# logs where cov or ft changed), OUT.png and OUT.svg (default OUT:
# fuzz/coverage.png). Uses gnuplot (Debian's gnuplot-nox, installed here
# when missing and root).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"

[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 LOGDIR [OUT.png]" >&2; exit 2; }
logs=$1
out=${2:-$here/fuzz/coverage.png}
svg=${out%.png}.svg
csv=${out%.png}.csv
mkdir -p "$(dirname "$out")"
ls "$logs"/*.log >/dev/null 2>&1 || { echo "$0: no TARGET.log in $logs" >&2; exit 1; }
ensure_pkgs gnuplot:gnuplot-nox

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "target,execs,cov,ft" > "$csv"
targets=()
for f in "$logs"/*.log; do
    t=$(basename "$f" .log)
    targets+=("$t")
    # "#N  NEW  cov: C ft: F ..." and the pulses; the final stats line last.
    awk -v t="$t" '/^#[0-9]+.*cov: / {
            n = substr($1, 2); c = ""; f = ""
            for (i = 2; i < NF; i++) { if ($i == "cov:") c = $(i + 1); if ($i == "ft:") f = $(i + 1) }
            if (c != pc || f != pf) print t "," n "," c "," f
            pc = c; pf = f; last = n
        }
        /^stat::number_of_executed_units:/ { total = $2 }
        END { if (total > last) print t "," total "," pc "," pf }' "$f" >> "$csv"
done
for t in "${targets[@]}"; do
    awk -F, -v t="$t" '$1 == t { rows[++n] = $2 " " $3; if ($3 + 0 > max) max = $3 + 0 }
        END { for (i = 1; i <= n; i++) { split(rows[i], r, " "); if (r[1] > 0) print r[1], 100 * r[2] / max } }' \
        "$csv" > "$tmp/$t.dat"
done

plot_cmds() { # terminal output
    echo "$1"
    echo "set output '$2'"
    echo "set title 'Fuzz targets: coverage (edges) against executions, each as % of its final value' font ',12'"
    echo "set xlabel 'executions'"
    echo "set ylabel 'edges covered (% of the final)'"
    echo "set logscale x"
    echo "set format x '1e%L'"
    echo "set yrange [*:100.5]"
    echo "set grid"
    echo "set key bottom right font ',9'"
    local line="plot " c=0
    for t in "${targets[@]}"; do
        [ -s "$tmp/$t.dat" ] || continue
        c=$((c + 1))
        [ $c = 1 ] || line+=", "
        line+="'$tmp/$t.dat' using 1:2 with steps lw 2 lc $c dt $(( (c - 1) / 8 + 1 )) title '$t'"
    done
    echo "$line"
}

plot_cmds "set terminal pngcairo size 900,560 font ',10' noenhanced" "$out" | gnuplot
plot_cmds "set terminal svg size 900,560 font ',10' dynamic noenhanced" "$svg" | gnuplot
echo "$csv"
echo "$out"
echo "$svg"
