#!/usr/bin/env bash
# Which edges a fuzz run found late, and where they are in our source
# (fuzz/README.md "Where coverage still grew"): reads a libFuzzer log of a
# run made with -print_pcs=1 and ASLR off, and prints, for every new edge
# found at or after execution FROM (0 by default), the execution, the
# address and the innermost source line of ours (not the standard library
# or a dependency) the edge was inlined into, with its function.
#
#   FUZZ_ARGS="-runs=10000000 -print_pcs=1" FUZZ_LOGDIR=/tmp/fl \
#       setarch "$(uname -m)" -R scripts/fuzz.sh 14400 TARGET
#   scripts/fuzz-new-edges.sh /tmp/fl/TARGET.log TARGET [FROM]
#
# libFuzzer prints a NEW_PC line for each edge before the status line of
# the input that found it. Without a sanitizer runtime it cannot name the
# line itself, so the addresses are resolved here with addr2line against
# the release build; PIE_BASE is where the binary was loaded
# (0x555555554000 with ASLR off, as setarch -R leaves it).
set -euo pipefail
[ $# -ge 2 ] || {
    echo "usage: $0 LOG TARGET [FROM]" >&2
    exit 2
}
log=$1
target=$2
from=${3:-0}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${FUZZ_BIN:-$here/fuzz/target/x86_64-unknown-linux-gnu/release/$target}
base=${PIE_BASE:-0x555555554000}
[ -f "$log" ] || {
    echo "$0: no log $log" >&2
    exit 1
}
[ -x "$bin" ] || {
    echo "$0: no binary $bin (scripts/fuzz.sh builds it)" >&2
    exit 1
}

# "EXEC PC" for every new edge at or after FROM.
found=$(awk -v from="$from" '
    $1 == "NEW_PC:" { pcs[n++] = $2; next }
    /^#[0-9]+/ {
        e = substr($1, 2) + 0
        if (e >= from)
            for (i = 0; i < n; i++) print e, pcs[i]
        n = 0
    }' "$log")
[ -n "$found" ] || {
    echo "no new edge at or after execution $from"
    exit 0
}
printf '%-10s %-10s %s\n' exec offset 'our innermost line (function)'
# addr2line -i prints an address's frames from the innermost inlined one
# out, each as a function line then a file:line line. The first frame in
# our tree (not under a target/ directory) names the edge.
while read -r e pc; do
    printf '%s %x\n' "$e" $((pc - base))
done <<<"$found" | while read -r e off; do
    frames=$(addr2line -f -i -C -e "$bin" "0x$off" 2>/dev/null || true)
    ours=$(awk -v root="$here/" '
        NR % 2 == 1 { fn = $0; next }
        NR == 2 { first = fn }
        index($0, root) == 1 && index($0, "/target/") == 0 {
            sub(root, "", $0); sub(/ \(discriminator [0-9]+\)/, "", $0)
            print $0 " (" fn ")"; found = 1; exit
        }
        END { if (!found) print "outside our tree (" first ")" }' <<<"$frames")
    # A fixture included with #[path] reads fuzz/src/../../CRATE/...
    ours=$(sed -E ':a; s#(^|/)[^/. ][^/]*/\.\./#\1#; ta' <<<"$ours")
    printf '%-10s %-10s %s\n' "$e" "$off" "$ours"
done
