#!/usr/bin/env bash
# Runs an infiniband-diags tool (or OpenSM, or any libibumad program) on the
# live emulated fabric, as a host attached to it: Debian's tools under
# LD_PRELOAD=libumad2sim.so, talking ibsim's protocol to our fabric.
#
#   scripts/ib-host.sh ibnetdiscover
#   scripts/ib-host.sh smpquery nodeinfo 3
#   scripts/ib-host.sh perfquery 3 1
#   scripts/ib-host.sh saquery -p
#   scripts/ib-host.sh sminfo
#   scripts/ib-host.sh ibroute 2
#   scripts/ib-host.sh --host H2 ibstat
#
# Options (before the tool):
#   --sock NAME   the fabric's socket name (IBSIM_SOCKNAME); default: the
#                 environment's IBSIM_SOCKNAME, else what the running
#                 emulator wrote to target/fabric/ibsim-sockname
#   --host NODE   the host node to attach to (SIM_HOST); default: the
#                 fabric's first host node (where OpenSM runs)
#   --timeout S   end the tool after S seconds (default 20; 0: never);
#                 OpenSM runs until stopped unless given one
# A diag whose query timed out sometimes hangs in libumad2sim at exit
# after printing its error: the deadline ends it. See docs/peers.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
U=/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so
sock="${IBSIM_SOCKNAME:-}"; host="${SIM_HOST:-}"; limit=""

usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --sock) sock=${2:?--sock needs a name}; shift 2 ;;
        --host) host=${2:?--host needs a node name}; shift 2 ;;
        --timeout) limit=${2:?--timeout needs seconds}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        -*) echo "ib-host.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { usage >&2; exit 2; }

if [ ! -e "$U" ]; then
    echo "ib-host.sh: $U is missing; install libumad2sim0 and infiniband-diags (scripts/deps.sh: ensure_ib_peers)" >&2
    exit 2
fi
if [ -z "$sock" ] && [ -r "$here/target/fabric/ibsim-sockname" ]; then
    sock=$(cat "$here/target/fabric/ibsim-sockname")
fi
if [ -z "$sock" ]; then
    echo "ib-host.sh: no emulated fabric found: start one (./run-qemu.sh --nodes 2) or give --sock NAME" >&2
    exit 2
fi
# umad2sim waits forever for a server that does not exist: look first.
if ! grep -q "@${sock}:ctl@" /proc/net/unix 2>/dev/null; then
    echo "ib-host.sh: no fabric is serving socket '${sock}' (is the emulator running?)" >&2
    exit 2
fi

tool=$1; shift
# A daemon runs until stopped; a diag answers within seconds (its own MAD
# timeouts included), so a short deadline keeps scripts from waiting long
# on one that hangs at exit.
if [ -z "$limit" ]; then
    case "$(basename "$tool")" in
        opensm) limit=0 ;;
        *) limit=20 ;;
    esac
fi
if [[ "$tool" != */* ]]; then
    path=$(PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" || true)
    [ -n "$path" ] || { echo "ib-host.sh: $tool not found (infiniband-diags installed?)" >&2; exit 2; }
    tool=$path
fi

# umad2sim writes a fake sysfs (./sys-<pid>) into the working directory.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ib-host.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
rc=0
IBSIM_SOCKNAME="$sock" SIM_HOST="$host" LD_PRELOAD="$U" \
    timeout --kill-after=5 "$limit" "$tool" "$@" || rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "ib-host.sh: $(basename "$tool") ended after ${limit}s (a diag whose query timed out can hang in libumad2sim at exit: docs/peers.md)" >&2
fi
exit "$rc"
