#!/usr/bin/env bash
# Usage: scripts/csv-collect.sh TRANSCRIPT DIR PREFIX
#
# Copies the CSV blocks of one node's console transcript into files: the
# lines between "--- csv begin NAME ---" and "--- csv end ---" (kernel log
# lines "[   1.234567] ..." and carriage returns left out) go to
# DIR/PREFIX-NAME.csv. Blocks of the same NAME go to one file, their header
# line kept once (a second block with another header is appended as it is).
# Prints the path of each file written; writes nothing (and creates no DIR)
# when the transcript has no block. run-qemu.sh calls it for every node.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 TRANSCRIPT DIR PREFIX" >&2; exit 2; }
log=$1; dir=$2; prefix=$3
[ -f "$log" ] || exit 0
grep -q -- '--- csv begin ' "$log" || exit 0
mkdir -p "$dir"
awk -v dir="$dir" -v prefix="$prefix" '
    { sub(/\r$/, "") }
    /^--- csv begin [A-Za-z0-9_.-]+ ---$/ {
        file = dir "/" prefix "-" $4 ".csv"; inblk = 1; first = 1; next
    }
    /^--- csv end ---$/ { inblk = 0; next }
    !inblk || /^\[ *[0-9]+\.[0-9]+\] / || $0 == "" { next }
    {
        if (first) {
            first = 0
            if (file in header) {
                if (header[file] == $0) next
            } else {
                header[file] = $0
                print file
            }
        }
        print > file
    }
' "$log"
