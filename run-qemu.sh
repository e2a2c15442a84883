#!/usr/bin/env bash
# Builds the kernel image and boots it under QEMU (q35; KVM if usable, else
# TCG) with the serial console on this terminal and, by default, an emulated
# ConnectX-3 served by cx3-emu over ivshmem (docs/ivshmem.md).
#
#   ./run-qemu.sh                         boot with the emulated HCA; Ctrl-A X quits
#   ./run-qemu.sh --run "lspci; ibstat"   run console commands unattended, print the
#                                         transcript, exit 0 only if all succeeded
#   ./run-qemu.sh --nodes 2               two guests on one emulated fabric (node 0 on
#                                         this terminal, the others logged to files)
#   ./run-qemu.sh --no-hca                boot without an HCA
#   ./run-qemu.sh --vfio 0000:04:00.0     pass a real ConnectX-3 through (vfio-pci)
#   ./run-qemu.sh --iso [--run ...]       build a GRUB rescue ISO and boot it (bare-metal path)
#   ./run-qemu.sh --linux [--run ...]     Debian's Linux 6.1 (its own mlx4 stack, rdma-core)
#                                         against the model over vfio-user (docs/vfio-user.md)
#   ./run-qemu.sh --vfu [--run ...]       our kernel against the model over vfio-user
#   ./run-qemu.sh --gdb                   wait for gdb on :1234
#   ./run-qemu.sh -- -smp 2               anything after -- goes to QEMU
#
# More: --kvm (use KVM; --vfio implies it; TCG otherwise),
# --emu-args "--fail RUN_FW" (cx3-emu options, e.g. fault injection),
# --append "log=debug" (kernel command line), --memory 512M, --timeout SEC
# (deadline for --run, default 120), --dry-run (print the commands and exit),
# --build-only, --no-build.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"

vfu_mode=""; run=""; iso=0; vfio=""; gdb=0; dry=0; build=1; build_only=0; hca=1; nodes=1; kvm=0
append=""; memory=512M; timeout_s=120; emu_args=""; qemu_extra=()

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --run) run=${2?--run needs commands}; shift ;;
        --iso) iso=1 ;;
        --vfio) vfio=${2?--vfio needs a PCI address}; shift; hca=0; kvm=1 ;;
        --kvm) kvm=1 ;;
        --no-hca) hca=0 ;;
        --nodes) nodes=${2?--nodes needs a number}; shift ;;
        --emu-args) emu_args=${2?--emu-args needs options}; shift ;;
        --linux|--vfu) vfu_mode=$1 ;;
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
if ! [[ "$nodes" =~ ^[1-8]$ ]]; then
    say "run-qemu.sh: --nodes takes 1 to 8"; exit 2
fi
if [ "$nodes" -gt 1 ] && [ "$hca" = 0 ]; then
    say "run-qemu.sh: --nodes needs the emulated HCA (not with --no-hca or --vfio)"; exit 2
fi

kernel_dir="$here/target/kernel"
kernel="$kernel_dir/x86_64-target/release/kernel"
emu_dir="$here/target/emu"
emu="$emu_dir/release/cx3-emu"
iso_file="$here/target/lego.iso"

if [ "$build" = 1 ] && [ "$dry" = 0 ]; then
    ensure_rust
    # Separate target dirs: the kernel's RUSTC_BOOTSTRAP build and the
    # emulator never invalidate, or wait on, the host build of `cargo test`.
    (cd "$here" && RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$kernel_dir" cargo kbuild --release --quiet)
    (cd "$here" && CARGO_TARGET_DIR="$emu_dir" cargo build --release --quiet -p sim --bin cx3-emu)
fi

cmdline="$append"
[ -n "$run" ] && cmdline="${cmdline:+$cmdline }run=\"$run\""

if [ "$iso" = 1 ] && [ "$dry" = 0 ]; then
    ensure_iso_tools
    stage=$(mktemp -d)
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
    grub-mkrescue -o "$iso_file" "$stage" >/dev/null 2>&1 || { rm -rf "$stage"; say "grub-mkrescue failed"; exit 1; }
    rm -rf "$stage"
fi
[ "$build_only" = 1 ] && exit 0

# --linux / --vfu: the model as a PCI function over vfio-user (scripts/vfu-run.sh).
if [ -n "$vfu_mode" ]; then
    vfu_args=("$vfu_mode" --timeout "$timeout_s" --memory "$memory")
    [ -n "$run" ] && vfu_args+=(--run "$run")
    [ -n "$append" ] && vfu_args+=(--append "$append")
    [ -n "$emu_args" ] && vfu_args+=(--emu-args "$emu_args")
    [ "$dry" = 1 ] && vfu_args+=(--dry-run)
    [ "$build" = 0 ] && vfu_args+=(--no-build)
    exec "$here/scripts/vfu-run.sh" "${vfu_args[@]}" -- "${qemu_extra[@]}"
fi

# --- per-node QEMU command lines --------------------------------------------
run_id="$$"
# Shared files in /dev/shm when it has room (containers often give it 64 MiB),
# else on disk under target/shm; QEMU maps either with share=on.
shm=/dev/shm
need=$(( ( $(numfmt --from=iec "$memory" 2>/dev/null || echo 0) + (16 << 20) ) * nodes ))
avail=$(df --output=avail -B1 "$shm" 2>/dev/null | tail -n 1 || echo 0)
if [ "$hca" = 1 ] && { [ ! -d "$shm" ] || [ "${avail:-0}" -lt "$need" ]; }; then
    shm="$here/target/shm"
    mkdir -p "$shm"
fi
win() { echo "$shm/cx3-$run_id-node$1.win"; }
ram() { echo "$shm/cx3-$run_id-node$1.ram"; }

qemu_cmd() { # node -> fills the array `q`
    local n=$1
    q=(qemu-system-x86_64 -display none -no-reboot -device isa-debug-exit,iobase=0xf4,iosize=4)
    # TCG unless asked: under nested virtualisation every port-I/O exit costs
    # tens of microseconds and KVM boots 6x slower than TCG (194 vs 33 ms).
    if [ "$kvm" = 1 ]; then q+=(-accel kvm -cpu host); else q+=(-accel tcg -cpu max); fi
    if [ "$hca" = 1 ]; then
        q+=(-machine q35,memory-backend=ram0 -m "$memory"
            -object "memory-backend-file,id=ram0,size=$memory,mem-path=$(ram "$n"),share=on"
            -object "memory-backend-file,id=hca0,size=16M,mem-path=$(win "$n"),share=on"
            -device ivshmem-plain,memdev=hca0)
    else
        q+=(-machine q35 -m "$memory")
    fi
    if [ "$iso" = 1 ]; then
        q+=(-cdrom "$iso_file" -boot d)
    else
        q+=(-kernel "$kernel" -append "$cmdline")
    fi
    [ -n "$vfio" ] && q+=(-device "vfio-pci,host=$vfio")
    [ "$gdb" = 1 ] && [ "$n" = 0 ] && q+=(-s -S)
    q+=("${qemu_extra[@]}")
}

emu_cmd=("$emu" --exit-with-parent)
for ((i = 0; i < nodes; i++)); do emu_cmd+=(--node "$(win $i),$(ram $i)"); done
# shellcheck disable=SC2206 # word splitting of the user's emulator options is intended
emu_cmd+=($emu_args)

print_cmd() {
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./:=,+@-]+$ ]]; then printf '%s ' "$a"; else printf '%q ' "$a"; fi
    done
    echo
}

if [ "$dry" = 1 ]; then
    [ "$hca" = 1 ] && print_cmd "${emu_cmd[@]}"
    for ((i = 0; i < nodes; i++)); do
        qemu_cmd $i
        if [ -n "$run" ] || [ "$i" -gt 0 ]; then q+=(-serial stdio); else q+=(-serial mon:stdio); fi
        print_cmd "${q[@]}"
    done
    exit 0
fi

if [ -n "$vfio" ] && [ ! -e "/sys/bus/pci/devices/$vfio" ]; then
    say "run-qemu.sh: no PCI device $vfio on this host"; exit 1
fi
ensure_qemu
[ -x "$emu" ] || [ "$hca" = 0 ] || { say "run-qemu.sh: $emu is not built (run without --no-build)"; exit 1; }

# --- start, and always clean up by pid --------------------------------------
emu_pid=""; qemu_pids=(); logdir=""
cleanup() {
    local p
    for p in "${qemu_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -n "$emu_pid" ] && kill "$emu_pid" 2>/dev/null || true
    for p in "${qemu_pids[@]}" $emu_pid; do wait "$p" 2>/dev/null || true; done
    for ((i = 0; i < nodes; i++)); do rm -f "$(win $i)" "$(ram $i)"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$hca" = 1 ]; then
    for ((i = 0; i < nodes; i++)); do
        truncate -s 16M "$(win $i)"
        truncate -s "$memory" "$(ram $i)"
    done
    "${emu_cmd[@]}" &
    emu_pid=$!
fi
[ "$gdb" = 1 ] && say "QEMU waits for gdb: gdb $kernel -ex 'target remote :1234'"

status_of() { # QEMU exit status -> ours
    case $1 in
        33) echo 0 ;; 35) echo 1 ;; 124|137) echo 124 ;; *) echo "$1" ;;
    esac
}

if [ "$nodes" = 1 ]; then
    qemu_cmd 0
    st=0
    if [ -n "$run" ]; then
        q+=(-serial stdio)
        timeout -k 5 "$timeout_s" "${q[@]}" </dev/null &
    else
        q+=(-serial mon:stdio)
        # A background job of a script reads /dev/null unless told otherwise.
        "${q[@]}" <&0 &
    fi
    qemu_pids=($!)
    wait "${qemu_pids[0]}" || st=$?
    qemu_pids=()
    st=$(status_of "$st")
    [ "$st" = 124 ] && say "run-qemu.sh: QEMU did not finish within ${timeout_s}s"
    exit "$st"
fi

# Several nodes: node 0 interactive unless --run; the others log to files.
logdir="$here/target/nodes"
mkdir -p "$logdir"
for ((i = nodes - 1; i >= 0; i--)); do
    qemu_cmd $i
    if [ -n "$run" ]; then
        q+=(-serial "file:$logdir/node$i.log")
        timeout -k 5 "$timeout_s" "${q[@]}" </dev/null &
    elif [ "$i" = 0 ]; then
        q+=(-serial mon:stdio)
        "${q[@]}" <&0 &
    else
        q+=(-serial "file:$logdir/node$i.log")
        "${q[@]}" </dev/null &
        say "node $i: serial console logged to $logdir/node$i.log"
    fi
    qemu_pids+=($!)
done
worst=0
for ((k = 0; k < nodes; k++)); do
    st=0
    wait "${qemu_pids[$k]}" || st=$?
    node=$((nodes - 1 - k))
    st=$(status_of "$st")
    [ -n "$run" ] && { echo "===== node $node (exit $st) ====="; cat "$logdir/node$node.log" 2>/dev/null || true; }
    [ "$st" != 0 ] && [ "$worst" = 0 ] && worst=$st
done
qemu_pids=()
exit "$worst"
