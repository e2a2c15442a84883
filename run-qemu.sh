#!/usr/bin/env bash
# Builds the kernel image and boots it under QEMU (q35, TCG or KVM), with the
# serial console on this terminal.
#
#   ./run-qemu.sh                         boot and drop into the console (Ctrl-A X quits)
#   ./run-qemu.sh --run "lspci; meminfo"  run console commands unattended, print the
#                                         transcript, exit 0 only if all succeeded
#   ./run-qemu.sh --iso [--run ...]       build a GRUB rescue ISO and boot it (bare-metal path)
#   ./run-qemu.sh --vfio 0000:04:00.0     pass a real ConnectX-3 through (vfio-pci)
#   ./run-qemu.sh --gdb                   wait for gdb on :1234
#   ./run-qemu.sh -- -smp 2               anything after -- goes to QEMU
#
# Other options: --append "log=debug" (kernel command line), --memory 512M,
# --timeout SEC (deadline for --run, default 120), --dry-run (print the QEMU
# command line and exit), --build-only, --no-build.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"

run=""; iso=0; vfio=""; gdb=0; dry=0; build=1; build_only=0
append=""; memory=512M; timeout_s=120; qemu_extra=()

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --run) run=${2?--run needs commands}; shift ;;
        --iso) iso=1 ;;
        --vfio) vfio=${2?--vfio needs a PCI address}; shift ;;
        --gdb) gdb=1 ;;
        --dry-run) dry=1 ;;
        --append) append=${2?--append needs text}; shift ;;
        --memory) memory=${2?--memory needs a size}; shift ;;
        --timeout) timeout_s=${2?--timeout needs seconds}; shift ;;
        --no-build) build=0 ;;
        --build-only) build_only=1 ;;
        -h|--help) usage 0 ;;
        --) shift; qemu_extra=("$@"); break ;;
        *) say "run-qemu.sh: unknown option '$1'"; usage 2 ;;
    esac
    shift
done

case "$run" in *\'*) say "run-qemu.sh: --run commands cannot contain single quotes"; exit 2 ;; esac
if [ -n "$vfio" ] && ! [[ "$vfio" =~ ^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$ ]]; then
    say "run-qemu.sh: --vfio wants a full PCI address such as 0000:04:00.0"; exit 2
fi

kernel_dir="$here/target/kernel"
kernel="$kernel_dir/x86_64-target/release/kernel"
iso_file="$here/target/lego.iso"

if [ "$build" = 1 ] && [ "$dry" = 0 ]; then
    ensure_rust
    # The kernel has its own target dir: its RUSTC_BOOTSTRAP build never
    # invalidates (or waits on) the host build of `cargo test`.
    (cd "$here" && RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$kernel_dir" cargo kbuild --release --quiet)
fi

cmdline="$append"
[ -n "$run" ] && cmdline="${cmdline:+$cmdline }run=\"$run\""

if [ "$iso" = 1 ] && [ "$dry" = 0 ]; then
    ensure_iso_tools
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/boot/grub"
    cp "$kernel" "$stage/boot/kernel"
    cat > "$stage/boot/grub/grub.cfg" <<CFG
set timeout=0
set default=0
serial --unit=0 --speed=115200
terminal_input serial console
terminal_output serial console
menuentry "LegoIB research kernel" {
    multiboot2 /boot/kernel '$cmdline'
    boot
}
CFG
    grub-mkrescue -o "$iso_file" "$stage" >/dev/null 2>&1 || { say "grub-mkrescue failed"; exit 1; }
fi
[ "$build_only" = 1 ] && exit 0

qemu=(qemu-system-x86_64 -machine q35 -m "$memory" -display none -no-reboot
      -device isa-debug-exit,iobase=0xf4,iosize=4)
# KVM when it works, TCG otherwise (QEMU tries the accelerators in order).
[ -w /dev/kvm ] && qemu+=(-accel kvm)
qemu+=(-accel tcg -cpu max)
if [ "$iso" = 1 ]; then
    qemu+=(-cdrom "$iso_file" -boot d)
else
    qemu+=(-kernel "$kernel" -append "$cmdline")
fi
if [ -n "$vfio" ]; then
    if [ "$dry" = 0 ] && [ ! -e "/sys/bus/pci/devices/$vfio/driver/unbind" -a ! -e "/sys/bus/pci/devices/$vfio" ]; then
        say "run-qemu.sh: no PCI device $vfio on this host"; exit 1
    fi
    qemu+=(-device "vfio-pci,host=$vfio")
fi
[ "$gdb" = 1 ] && qemu+=(-s -S)
if [ -n "$run" ]; then
    qemu+=(-serial stdio)
else
    qemu+=(-serial mon:stdio)
fi
qemu+=("${qemu_extra[@]}")

if [ "$dry" = 1 ]; then
    for a in "${qemu[@]}"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./:=,+@-]+$ ]]; then printf '%s ' "$a"; else printf '%q ' "$a"; fi
    done
    echo
    exit 0
fi
ensure_qemu
[ "$gdb" = 1 ] && say "QEMU waits for gdb: gdb $kernel -ex 'target remote :1234'"

status=0
if [ -n "$run" ]; then
    timeout -k 5 "$timeout_s" "${qemu[@]}" </dev/null || status=$?
else
    "${qemu[@]}" || status=$?
fi
case $status in
    33) exit 0 ;;                      # isa-debug-exit: success
    35) exit 1 ;;                      # isa-debug-exit: failure (command failed, crash)
    124|137) say "run-qemu.sh: QEMU did not finish within ${timeout_s}s"; exit 124 ;;
    *) exit "$status" ;;
esac
