#!/usr/bin/env bash
# Boots a guest against the model served as a PCI function over vfio-user
# (cx3-vfu, docs/vfio-user.md): `run-qemu.sh --linux` (Debian's Linux 6.1
# with its own mlx4 stack and rdma-core, built by scripts/linux-guest.sh) and
# `run-qemu.sh --vfu` (our kernel, probing the function as a plain PCI
# device: the path a passed-through card takes) come here.
#
#   scripts/vfu-run.sh --linux|--vfu [--run "cmd; cmd"] [--timeout SEC]
#       [--memory SIZE] [--append TEXT] [--emu-args "cx3-vfu options"]
#       [--dry-run] [--no-build] [--vfu-log FILE] [-- QEMU args]
#
# --run works as for our kernel: the guest runs the commands (Linux: each
# `;`-separated command through its shell), prints the transcript, and the
# status is 0 only if every command succeeded, 124 on the deadline. cx3-vfu's
# messages (violations, DMA faults, --trace) go to stderr, or to --vfu-log.
# QEMU runs under TCG (KVM hangs this machine kind's nested guests early).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"

guest=""; run=""; timeout_s=180; memory=1G; append=""; emu_args=""; dry=0; build=1
vfu_log=""; qemu_extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --linux) guest=linux ;;
        --vfu) guest=lego ;;
        --run) run=${2?--run needs commands}; shift ;;
        --timeout) timeout_s=${2?--timeout needs seconds}; shift ;;
        --memory) memory=${2?--memory needs a size}; shift ;;
        --append) append=${2?--append needs text}; shift ;;
        --emu-args) emu_args=${2?--emu-args needs options}; shift ;;
        --vfu-log) vfu_log=${2?--vfu-log needs a file}; shift ;;
        --dry-run) dry=1 ;;
        --no-build) build=0 ;;
        --) shift; qemu_extra=("$@"); break ;;
        *) say "vfu-run.sh: unknown option '$1'"; exit 2 ;;
    esac
    shift
done
[ -n "$guest" ] || { say "vfu-run.sh: --linux or --vfu is required"; exit 2; }
[[ "$timeout_s" =~ ^[0-9]+$ ]] || { say "vfu-run.sh: --timeout wants seconds"; exit 2; }
case "$run" in *\"*) say "vfu-run.sh: --run commands cannot contain double quotes"; exit 2 ;; esac

vfu="$here/target/emu/release/cx3-vfu"
kernel="$here/target/kernel/x86_64-target/release/kernel"
if [ "$build" = 1 ] && [ "$dry" = 0 ]; then
    ensure_rust
    (cd "$here" && CARGO_TARGET_DIR="$here/target/emu" cargo build --release --quiet -p sim --bin cx3-vfu)
fi

if [ "$dry" = 1 ]; then
    qemu=$("$here/scripts/qemu-vfu.sh" --check >/dev/null 2>&1 && "$here/scripts/qemu-vfu.sh" || echo qemu-system-x86_64)
    img="$here/target/linux-guest/image"
else
    qemu=$("$here/scripts/qemu-vfu.sh")
    img=""
    [ "$guest" = linux ] && img=$("$here/scripts/linux-guest.sh")
fi

sock="${TMPDIR:-/tmp}/cx3-vfu-$$.sock"
vfu_cmd=("$vfu" --socket "$sock" --exit-with-parent)
# shellcheck disable=SC2206 # word splitting of the user's options is intended
vfu_cmd+=($emu_args)

# shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
q=("$qemu" -accel tcg -cpu max -m "$memory"
   -object "memory-backend-memfd,id=ram0,size=$memory,share=on" -machine q35,memory-backend=ram0
   -display none -no-reboot -net none -device isa-debug-exit,iobase=0xf4,iosize=4
   -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$sock\",\"type\":\"unix\"}}")
if [ "$guest" = linux ]; then
    cmdline="console=ttyS0 quiet panic=-1${append:+ $append}"
    [ -n "$run" ] && cmdline="$cmdline run=\"$run\""
    q+=(-kernel "$img/vmlinuz" -initrd "$img/initrd.cpio.gz" -append "$cmdline")
else
    cmdline="$append"
    [ -n "$run" ] && cmdline="${cmdline:+$cmdline }run=\"$run\""
    q+=(-kernel "$kernel" -append "$cmdline")
fi
q+=("${qemu_extra[@]}")
if [ -n "$run" ]; then q+=(-serial stdio); else q+=(-serial mon:stdio); fi

if [ "$dry" = 1 ]; then
    printf '%q ' "${vfu_cmd[@]}"; echo
    printf '%q ' "${q[@]}"; echo
    exit 0
fi
[ -x "$vfu" ] || { say "vfu-run.sh: $vfu is not built (run without --no-build)"; exit 1; }
[ "$guest" = lego ] && { [ -f "$kernel" ] || { say "vfu-run.sh: $kernel is not built"; exit 1; }; }

vfu_pid=""; qemu_pid=""
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
    if [ -n "$qemu_pid" ]; then kill "$qemu_pid" 2>/dev/null || true; fi
    if [ -n "$vfu_pid" ]; then kill "$vfu_pid" 2>/dev/null || true; fi
    for p in $qemu_pid $vfu_pid; do wait "$p" 2>/dev/null || true; done
    rm -f "$sock"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -f "$sock"
if [ -n "$vfu_log" ]; then "${vfu_cmd[@]}" 2>"$vfu_log" & else "${vfu_cmd[@]}" & fi
vfu_pid=$!
for _ in $(seq 100); do
    [ -S "$sock" ] && break
    kill -0 "$vfu_pid" 2>/dev/null || { say "vfu-run.sh: cx3-vfu exited early"; exit 1; }
    sleep 0.05
done
[ -S "$sock" ] || { say "vfu-run.sh: cx3-vfu did not create $sock within 5 s"; exit 1; }

st=0
if [ -n "$run" ]; then
    # QEMU's vfio-user client reports harmless notes on stderr; keep them
    # apart from the guest's transcript only by stream.
    timeout -k 5 "$timeout_s" "${q[@]}" </dev/null &
else
    "${q[@]}" <&0 &
fi
qemu_pid=$!
wait "$qemu_pid" || st=$?
qemu_pid=""
# Let cx3-vfu see the client go and report (--stats).
for _ in $(seq 40); do kill -0 "$vfu_pid" 2>/dev/null || break; sleep 0.05; done
case $st in
    33) st=0 ;; 35) st=1 ;; 124|137) st=124 ;;
esac
[ "$st" = 124 ] && say "vfu-run.sh: QEMU did not finish within ${timeout_s}s"
exit "$st"
