#!/usr/bin/env bash
# docs/ethernet.md's figure: two of our guests, `ping -c 100 -i 0.05` from
# node 0 to node 1, alternating Ethernet (--link-layer eth, mlx4_en's eth0,
# no SM) and InfiniBand (ib0, IPoIB, --sm embedded), ROUNDS boots of each
# (default 2). One line per boot: the load average before and after, the
# median RTT of the 100 replies and ping's own summary.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
rounds=${1:-2}
./run-qemu.sh --build-only >/dev/null
for ((round = 1; round <= rounds; round++)); do
    for ll in eth ib; do
        if [ "$ll" = eth ]; then extra=(--link-layer eth --sm none); else extra=(--sm embedded); fi
        before=$(cut -d' ' -f1-3 /proc/loadavg)
        out=$(./run-qemu.sh --no-build --nodes 2 "${extra[@]}" --timeout 200 \
            --run-on 0 "retry -n 90 -i 1 ping -c 1 -W 1 10.0.0.2; ping -c 100 -i 0.05 10.0.0.2" \
            --run-on 1 "retry -n 90 -i 1 ping -c 1 -W 1 10.0.0.1; retry -n 120 -i 1 -u ping -c 1 -W 1 10.0.0.1" 2>&1 || true)
        after=$(cut -d' ' -f1-3 /proc/loadavg)
        node0=$(awk '/===== node 0/{f=1} /===== node 1/{f=0} f' <<<"$out")
        ping=$(awk '/lego> ping -c 100/{g=1} g' <<<"$node0")
        median=$(grep -o "time=[0-9.]*" <<<"$ping" | cut -d= -f2 | sort -g |
            awk '{a[NR]=$1} END{if (NR) print a[int((NR+1)/2)]; else print "-"}')
        summary=$(grep -E "^rtt|packets transmitted" <<<"$ping" | tr -d '\r' | tr '\n' ' ')
        echo "$ll round $round: load $before -> $after | median $median ms | $summary"
    done
done
