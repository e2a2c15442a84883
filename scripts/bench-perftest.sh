#!/usr/bin/env bash
# Usage: scripts/bench-perftest.sh [-n ITERS] [-s SIZE] [--runs K] [--sm opensm|embedded]
#
# The issue-11 figures in one command: two guests under one SM, node 0
# serving, node 1 running the perftest tools against LID 3 (each client
# behind the console's `retry`, so no fixed sleeps): ib_write_bw at SIZE
# (64 KiB by default) K times, then ib_write_lat, ib_read_lat and
# ib_send_lat at 8 bytes. Prints the load average before and after, the
# client's result rows, and cx3-emu's --stats total line (its CPU beside
# the wall time). The full transcript stays in target/bench-perftest.log.
# Figures mean little on a loaded machine: compare the load averages.
set -euo pipefail
cd "$(dirname "$0")/.."

iters=5000; size=65536; runs=3; sm=opensm
while [ $# -gt 0 ]; do
    case "$1" in
        -n) iters=${2:?}; shift 2 ;;
        -s) size=${2:?}; shift 2 ;;
        --runs) runs=${2:?}; shift 2 ;;
        --sm) sm=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "$0: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$iters$size$runs" in *[!0-9]*) echo "$0: -n, -s and --runs take numbers" >&2; exit 2 ;; esac

server=""; client=""
add() { server+="${server:+; }$1"; client+="${client:+; }retry -n 30 -i 1 $1 3"; }
for _ in $(seq "$runs"); do add "ib_write_bw -s $size -n $iters"; done
for t in ib_write_lat ib_read_lat ib_send_lat; do add "$t -s 8 -n 1000"; done

mkdir -p target
log=target/bench-perftest.log
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
./run-qemu.sh --nodes 2 --sm "$sm" --timeout 900 --emu-args --stats \
    --run-on 0 "$server" --run-on 1 "$client" > "$log" 2>&1 || status=$?
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
# Node 1's transcript: the client's header and result lines.
awk '/^===== node 1/{on=1} on && (/ #bytes/ || /^ [0-9]+ +[0-9]+ /)' "$log"
grep -E '^total:' "$log" || true
if [ "$status" -ne 0 ]; then
    echo "$0: run-qemu.sh exited $status; transcript: $log" >&2
    exit "$status"
fi
