#!/usr/bin/env bash
# The soak (issue 26, docs/soak.md): two or three of our guests under the
# real OpenSM on the emulated fabric, for a set time, running perftest
# bandwidth runs with --check, rmem writes and checked reads and pings over
# IPoIB, while the fabric is disturbed at seeded random times (cable pulls,
# OpenSM restarts, bursts of dropped packets). Prints what ran, what was
# injected, the data checks, the model's violations, the errors by kind and
# the memory at the start and the end; exit status 0 only if every check
# passed.
#
#   scripts/soak.sh [--minutes N] [--nodes 2|3] [--seed S]
#
# N defaults to 60 (the figure); --minutes 3 is a smoke run. One soak at a
# time: it takes the machine's cores. The guests' transcripts, the
# emulator's and OpenSM's logs stay under target/soak/run-PID/.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
minutes=60; nodes=2; seed=""

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes=${2:?--minutes needs a number}; shift 2 ;;
        --nodes) nodes=${2:?--nodes needs 2 or 3}; shift 2 ;;
        --seed) seed=${2:?--seed needs a number}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "soak.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[[ "$minutes" =~ ^[1-9][0-9]{0,3}$ ]] || { echo "soak.sh: --minutes takes 1 to 9999, not '$minutes'" >&2; exit 2; }
[[ "$nodes" =~ ^[23]$ ]] || { echo "soak.sh: --nodes takes 2 or 3, not '$nodes'" >&2; exit 2; }
[ -z "$seed" ] || [[ "$seed" =~ ^[0-9]{1,18}$ ]] || { echo "soak.sh: --seed takes a decimal number" >&2; exit 2; }
[ -n "$seed" ] || seed=$(( $(date +%s) % 1000000007 ))

# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"
ensure_qemu
ensure_ib_peers
# The kernel image and the emulator, as run-qemu.sh builds them.
"$here/run-qemu.sh" --build-only
cd "$here"
SOAK_MINUTES=$minutes SOAK_NODES=$nodes SOAK_SEED=$seed \
    cargo test --quiet -p tests --test soak -- --ignored --nocapture --exact soak
