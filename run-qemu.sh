#!/usr/bin/env bash
# Builds the kernel image and boots it under QEMU with an emulated ConnectX-3
# (cx3-emu over ivshmem, docs/ivshmem.md). `./run-qemu.sh --help` for usage.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"
# shellcheck source=scripts/nodes.sh
. "$here/scripts/nodes.sh"

usage_line="Usage: ./run-qemu.sh [options] [-- QEMU options]"

usage() {
    cat <<'USAGE'
Usage: ./run-qemu.sh [options] [-- QEMU options]

Builds the kernel image and boots it under QEMU (q35, TCG by default; --kvm
for KVM) with the serial console on this terminal and, by default, an
emulated ConnectX-3 served by cx3-emu over ivshmem (docs/ivshmem.md), on a
fabric whose subnet manager brings the ports to Active: the real OpenSM by
default (docs/peers.md).

  ./run-qemu.sh                         boot with the emulated HCA; Ctrl-A X quits
  ./run-qemu.sh --run "lspci; ibstat"   run console commands unattended, print the
                                        transcript, exit 0 only if all succeeded
  ./run-qemu.sh --nodes 2               two guests on one emulated fabric (node 0 on
                                        this terminal, the others logged to files)
  ./run-qemu.sh --sm embedded           the fabric's own SM instead of OpenSM
  ./run-qemu.sh --nodes 2 --run-on 0 "ib_write_bw" --run-on 1 "ib_write_bw 1"
                                        a different script on each node; every
                                        transcript printed, exit 0 only if all succeeded
  ./run-qemu.sh --no-hca                boot without an HCA
  ./run-qemu.sh --vfio 0000:04:00.0     pass a real ConnectX-3 through (vfio-pci)
  ./run-qemu.sh --iso [--run ...]       build a GRUB rescue ISO and boot it (bare-metal path)
  ./run-qemu.sh --linux [--run ...]     Debian's Linux 6.1 (its own mlx4 stack, rdma-core)
                                        against the model over vfio-user (docs/vfio-user.md)
  ./run-qemu.sh --vfu [--run ...]       our kernel against the model over vfio-user
  ./run-qemu.sh --linux --nodes 2 --run-on 0 "ib_write_bw" --run-on 1 "retry 9 ib_write_bw 10.0.0.1"
                                        two Linux guests on one fabric (OpenSM), real perftest
  ./run-qemu.sh --guests linux,lego     a mixed fabric: a Linux guest and ours over vfio-user
  ./run-qemu.sh --gdb                   wait for gdb on :1234
  ./run-qemu.sh -- -smp 2               anything after -- goes to QEMU

Options:
  --run CMDS        console commands separated by ';' (no single quotes)
  --run-on N CMDS   node N's own commands (instead of --run's, for that node);
                    repeat for each node; every node then needs a script
  --nodes N         1 to 8 guests on one emulated fabric (default 1)
  --sm SM           the subnet manager: opensm (default: Debian's OpenSM, a
                    child of cx3-emu, installed on first use; its log under
                    target/fabric/), embedded (the fabric's own SM and SA) or
                    none (ports stay Initializing). Every choice serves the
                    diags: scripts/ib-host.sh sminfo (docs/peers.md). The
                    vfio-user paths pass it to cx3-vfu
  --link-layer LL   the fabric each node's ports are on: ib (default), eth
                    (port 1 on an Ethernet switch: mlx4_en's eth0, RoCE) or
                    P1,P2 such as ib,eth (cx3-emu --link-layer; docs/ethernet.md)
  --no-hca          no emulated HCA
  --vfio ADDR       pass a real ConnectX-3 through (implies --kvm)
  --kvm             use KVM (default: TCG, faster under nested virtualisation)
  --emu-args OPTS   cx3-emu options, e.g. "--fail RUN_FW" (cx3-emu --help);
                    if cx3-emu refuses them, nothing boots
  --append TEXT     kernel command line, e.g. "log=debug"; with the emulated
                    HCA node N also gets ip=ib0:10.0.0.<N+1>/24 (its IPoIB
                    address, set once ib0 exists) unless TEXT has an ip=;
                    with --link-layer the first port's link (ib0 or eth0)
                    gets 10.0.0.<N+1>, the second's 10.0.1.<N+1>
  --memory SIZE     guest RAM: a number with an optional M or G suffix
                    (no suffix: MiB, as QEMU's -m), 64M to 64G (default 512M)
  --timeout SEC     deadline for --run, 1 to 86400 seconds (default 120)
  --iso             boot a GRUB rescue ISO instead of -kernel
  --linux, --vfu    the model as a PCI function over vfio-user (cx3-vfu; with
                    --nodes, --run, --run-on, --timeout, --memory, --append,
                    --emu-args: cx3-vfu options); the Linux guest and a QEMU
                    >= 10.1 are fetched once into target/ (scripts/vfu-run.sh)
  --guests LIST     vfio-user guests by kind, e.g. linux,linux,lego (Linux or
                    our kernel, one node each, all on one fabric)
  --gdb             wait for gdb on :1234
  --dry-run         print the commands and exit
  --build-only      build and exit
  --no-build        use the image built last time
  -h, --help        this text

Exit status: 0 success (with --run: every command succeeded), 1 failure or
crash (or cx3-emu failed to start), 2 bad usage, 124 the --timeout passed.
USAGE
}

bad_usage() { # message -> stderr, with the usage line; status 2
    say "run-qemu.sh: $1"
    say "$usage_line"
    say "(./run-qemu.sh --help for the options)"
    exit 2
}

declare -A run_on=()
vfu_mode=""; vfu_guests=""; sm=""; run=""; run_set=0; iso=0; vfio=""; gdb=0; dry=0; build=1; build_only=0; hca=1; nodes=1; kvm=0
append=""; memory=512M; timeout_s=120; emu_args=""; qemu_extra=(); link_layer=""

while [ $# -gt 0 ]; do
    opt=$1
    case "$opt" in
        --run|--vfio|--nodes|--emu-args|--append|--memory|--timeout|--guests|--sm|--link-layer)
            [ $# -ge 2 ] || bad_usage "$opt needs an argument"
            val=$2; shift ;;
    esac
    case "$opt" in
        --run) run=$val; run_set=1 ;;
        --run-on)
            [ $# -ge 3 ] || bad_usage "--run-on needs a node number and its commands"
            [[ "$2" =~ ^[0-7]$ ]] || bad_usage "--run-on takes a node number 0 to 7, not '$2'"
            [ -z "${run_on[$2]+x}" ] || bad_usage "--run-on $2 given twice"
            [ -n "${3//[[:space:];]/}" ] || bad_usage "--run-on $2 needs at least one command"
            case "$3" in *\'*|*\"*) bad_usage "--run-on commands cannot contain quotes" ;; esac
            run_on[$2]=$3; shift 2 ;;
        --iso) iso=1 ;;
        --vfio) vfio=$val; hca=0; kvm=1 ;;
        --kvm) kvm=1 ;;
        --no-hca) hca=0 ;;
        --nodes) nodes=$val ;;
        --emu-args) emu_args=$val ;;
        --link-layer)
            case "$val" in ib|eth|ib,ib|ib,eth|eth,ib|eth,eth) ;; *) bad_usage "--link-layer takes ib, eth or P1,P2 (e.g. ib,eth), not '$val'" ;; esac
            link_layer=$val ;;
        --sm)
            case "$val" in opensm|embedded|none) ;; *) bad_usage "--sm takes opensm, embedded or none, not '$val'" ;; esac
            sm=$val ;;
        --linux|--vfu) vfu_mode=$opt ;;
        --guests) vfu_mode=--guests; vfu_guests=$val ;;
        --gdb) gdb=1 ;;
        --dry-run) dry=1 ;;
        --append) append=$val ;;
        --memory) memory=$val ;;
        --timeout) timeout_s=$val ;;
        --no-build) build=0 ;;
        --build-only) build_only=1 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; qemu_extra=("$@"); break ;;
        *) say "run-qemu.sh: unknown option '$opt'"; usage >&2; exit 2 ;;
    esac
    shift
done

[ "$run_set" = 1 ] && [ -z "${run//[[:space:];]/}" ] && bad_usage "--run needs at least one command"
case "$run" in *\'*) bad_usage "--run commands cannot contain single quotes" ;; esac
case "$append" in *\"*|*\'*) bad_usage "--append text cannot contain quotes" ;; esac
if [ -n "$vfio" ] && ! [[ "$vfio" =~ ^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$ ]]; then
    bad_usage "--vfio wants a full PCI address such as 0000:04:00.0"
fi
if ! [[ "$nodes" =~ ^[1-8]$ ]]; then
    bad_usage "--nodes takes 1 to 8, not '$nodes'"
fi
if [ "$nodes" -gt 1 ] && [ "$hca" = 0 ]; then
    bad_usage "--nodes needs the emulated HCA (not with --no-hca or --vfio)"
fi
if [ -n "$vfu_mode" ] && { [ "$hca" = 0 ] || [ "$iso" = 1 ] || [ "$gdb" = 1 ] || [ "$kvm" = 1 ]; }; then
    bad_usage "$vfu_mode boots under TCG on the emulated fabric (not with --no-hca, --vfio, --iso, --gdb or --kvm)"
fi
if [ -n "$vfu_guests" ]; then
    [[ "$vfu_guests" =~ ^(linux|lego)(,(linux|lego)){0,7}$ ]] || bad_usage "--guests takes 1 to 8 of linux and lego, comma-separated, not '$vfu_guests'"
    n_guests=$(tr , '\n' <<<"$vfu_guests" | wc -l)
    [ "$nodes" = 1 ] || [ "$nodes" = "$n_guests" ] || bad_usage "--guests names $n_guests guests but --nodes says $nodes"
    nodes=$n_guests
fi
if [ "${#run_on[@]}" -gt 0 ]; then
    for k in "${!run_on[@]}"; do
        [ "$k" -lt "$nodes" ] || bad_usage "--run-on $k: there are only $nodes node(s) (--nodes)"
    done
    for ((k = 0; k < nodes; k++)); do
        [ -n "${run_on[$k]+x}" ] || [ -n "$run" ] ||
            bad_usage "node $k has no script: give --run-on $k CMDS (or --run for every node)"
    done
    if [ "$iso" = 1 ]; then
        bad_usage "--run-on boots nodes with -kernel on the emulated fabric (not with --iso)"
    fi
fi
if [ -n "$emu_args" ] && [ "$hca" = 0 ]; then
    bad_usage "--emu-args needs the emulated HCA (not with --no-hca or --vfio)"
fi
# The subnet manager: --sm, else what --emu-args asks for (--sm X or its
# alias --embedded-sm), else OpenSM.
sm_set=0; [ -n "$sm" ] && sm_set=1
emu_sm=""
read -ra emu_words <<<"$emu_args"
for ((k = 0; k < ${#emu_words[@]}; k++)); do
    case "${emu_words[k]}" in
        --embedded-sm) emu_sm=embedded ;;
        --sm) emu_sm=${emu_words[k + 1]:-} ;;
        --sm=*) emu_sm=${emu_words[k]#--sm=} ;;
    esac
done
if [ -n "$emu_sm" ]; then
    [ -z "$sm" ] || [ "$sm" = "$emu_sm" ] ||
        bad_usage "--sm $sm and --emu-args asking for the $emu_sm SM disagree"
    sm=$emu_sm
fi
[ -n "$sm" ] || sm=opensm
if [ "$sm_set" = 1 ] && [ "$hca" = 0 ]; then
    bad_usage "--sm needs the emulated HCA (not with --no-hca or --vfio)"
fi
if ! [[ "$timeout_s" =~ ^[1-9][0-9]{0,4}$ ]] || [ "$timeout_s" -gt 86400 ]; then
    bad_usage "--timeout takes whole seconds from 1 to 86400, not '$timeout_s'"
fi
# Guest RAM in MiB: QEMU reads a bare number as MiB; the shared RAM file and
# cx3-emu get the same size in bytes.
if [[ "$memory" =~ ^([1-9][0-9]{0,5})([MmGg]?)$ ]]; then
    mem_mib=${BASH_REMATCH[1]}
    case "${BASH_REMATCH[2]}" in [Gg]) mem_mib=$((mem_mib * 1024)) ;; esac
else
    mem_mib=0
fi
if [ "$mem_mib" -lt 64 ] || [ "$mem_mib" -gt 65536 ]; then
    bad_usage "--memory takes 64M to 64G (a number with an optional M or G suffix; no suffix means MiB), not '$memory'"
fi
memory="${mem_mib}M"
mem_bytes=$((mem_mib << 20))

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

# Each node's addresses on the emulated fabric: node N gets 10.0.0.<N+1>/24
# on its first port's link (ib0, or eth0 with --link-layer eth) and, with two
# link layers given, 10.0.1.<N+1>/24 on the second's (set once the link
# exists), unless --append has an ip=.
node_ip() { # node -> its ip= words, or nothing
    [ "$hca" = 1 ] || return 0
    case " $append " in *" ip="*) return 0 ;; esac
    local n=$(($1 + 1)) p1 p2
    case "${link_layer:-ib}" in
        ib) echo "ip=ib0:10.0.0.$n/24" ;;
        eth) echo "ip=eth0:10.0.0.$n/24" ;;
        *)
            p1=${link_layer%,*}; p2=${link_layer#*,}
            if [ "$p1" = "$p2" ]; then
                echo "ip=${p1}0:10.0.0.$n/24 ip=${p2}1:10.0.1.$n/24"
            else
                echo "ip=${p1}0:10.0.0.$n/24 ip=${p2}0:10.0.1.$n/24"
            fi ;;
    esac
}
# Whether the guests run scripts (--run, or --run-on for each node).
scripted=0
{ [ -n "$run" ] || [ "${#run_on[@]}" -gt 0 ]; } && scripted=1
node_cmdline() { # node -> its kernel command line: --append, its address, its --run-on script (else --run's)
    local c="$append" ip r="$run"
    ip=$(node_ip "$1")
    [ -n "$ip" ] && c="${c:+$c }$ip"
    [ -n "${run_on[$1]+x}" ] && r=${run_on[$1]}
    [ -n "$r" ] && c="${c:+$c }run=\"$r\""
    echo "$c"
}
cmdline=$(node_cmdline 0)

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
    if [ -n "$vfu_guests" ]; then vfu_args=(--guests "$vfu_guests"); else vfu_args=("$vfu_mode" --nodes "$nodes"); fi
    vfu_args+=(--timeout "$timeout_s" --memory "$memory")
    [ -n "$run" ] && vfu_args+=(--run "$run")
    for k in "${!run_on[@]}"; do vfu_args+=(--run-on "$k" "${run_on[$k]}"); done
    [ -n "$append" ] && vfu_args+=(--append "$append")
    vfu_emu="$emu_args${link_layer:+ --link-layer $link_layer}"
    [ -n "$vfu_emu" ] && vfu_args+=(--emu-args "${vfu_emu# }")
    [ "$sm_set" = 1 ] && vfu_args+=(--sm "$sm")
    [ "$dry" = 1 ] && vfu_args+=(--dry-run)
    [ "$build" = 0 ] && vfu_args+=(--no-build)
    exec "$here/scripts/vfu-run.sh" "${vfu_args[@]}" -- "${qemu_extra[@]}"
fi

# --- per-node QEMU command lines --------------------------------------------
run_id="$$"
# Shared files in /dev/shm when it has room (containers often give it 64 MiB),
# else on disk under target/shm; QEMU maps either with share=on.
shm=/dev/shm
need=$(( (mem_bytes + (16 << 20)) * nodes ))
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
        q+=(-kernel "$kernel" -append "$(node_cmdline "$n")")
    fi
    [ -n "$vfio" ] && q+=(-device "vfio-pci,host=$vfio")
    [ "$gdb" = 1 ] && [ "$n" = 0 ] && q+=(-s -S)
    q+=("${qemu_extra[@]}")
}

# OpenSM's log, cache and dumps: one directory per run (fresh LIDs each
# boot); the socket name for scripts/ib-host.sh.
fabric_dir="$here/target/fabric"
sm_dir="$fabric_dir/run-$run_id"
emu_cmd=("$emu" --exit-with-parent --sm "$sm" --sm-dir "$sm_dir"
    --sockname-file "$fabric_dir/ibsim-sockname")
for ((i = 0; i < nodes; i++)); do emu_cmd+=(--node "$(win $i),$(ram $i)"); done
[ -n "$link_layer" ] && emu_cmd+=(--link-layer "$link_layer")
# shellcheck disable=SC2206 # word splitting of the user's emulator options is intended
emu_cmd+=($emu_args)

print_cmd() {
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./:=,+@-]+$ ]]; then printf '%s ' "$a"; else printf '%q ' "$a"; fi
    done
    echo
}

# Several nodes: node 0 interactive unless scripted; the others log to files.
# Scripted runs (tests, experiments) may run side by side: each keeps its
# consoles in a directory of its own, gone with the run.
if [ "$scripted" = 1 ]; then logdir="$here/target/nodes/run-$$"; else logdir="$here/target/nodes"; fi

if [ "$dry" = 1 ]; then
    [ "$hca" = 1 ] && print_cmd "${emu_cmd[@]}"
    for ((i = 0; i < nodes; i++)); do
        qemu_cmd $i
        # The console the run gives the node (one node: this terminal).
        if [ "$nodes" -gt 1 ]; then
            q+=(-serial "$(node_serial "$logdir/node" "$i")")
        elif [ "$scripted" = 1 ]; then
            q+=(-serial stdio)
        else
            q+=(-serial mon:stdio)
        fi
        print_cmd "${q[@]}"
    done
    exit 0
fi

if [ -n "$vfio" ] && [ ! -e "/sys/bus/pci/devices/$vfio" ]; then
    say "run-qemu.sh: no PCI device $vfio on this host"; exit 1
fi
ensure_qemu
[ -x "$emu" ] || [ "$hca" = 0 ] || { say "run-qemu.sh: $emu is not built (run without --no-build)"; exit 1; }
if [ "$hca" = 1 ] && [ "$sm" = opensm ]; then
    ensure_ib_peers
    if ! { [ -x /usr/sbin/opensm ] || command -v opensm >/dev/null 2>&1; } ||
        [ ! -e /usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so ]; then
        say "run-qemu.sh: OpenSM cannot run: the packages opensm and libumad2sim0 are missing and could not be installed"
        say "  (Debian/Ubuntu: sudo apt-get install opensm libumad2sim0), or boot with --sm embedded for the fabric's own SM"
        exit 1
    fi
fi
if [ "$hca" = 1 ]; then
    # Directories of earlier runs whose script has ended go (their logs
    # are kept until the next run).
    mkdir -p "$fabric_dir"
    for d in "$fabric_dir"/run-*; do
        [ -d "$d" ] || continue
        p=${d##*/run-}
        [[ "$p" =~ ^[0-9]+$ ]] && [ "$p" != "$run_id" ] && ! kill -0 "$p" 2>/dev/null && rm -rf "$d"
    done
fi

# --- start, and always clean up by pid --------------------------------------
emu_pid=""; qemu_pids=(); rm_logdir=""
cleanup() {
    local p
    for p in "${qemu_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -n "$emu_pid" ] && kill "$emu_pid" 2>/dev/null || true
    for p in "${qemu_pids[@]}" $emu_pid; do wait "$p" 2>/dev/null || true; done
    for ((i = 0; i < nodes; i++)); do rm -f "$(win $i)" "$(ram $i)"; done
    if [ -n "$rm_logdir" ]; then rm -rf "$rm_logdir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# cx3-emu publishes each window's magic last (docs/ivshmem.md); until then no
# guest may boot. An emulator that exits first (bad --emu-args, unusable
# files) ends the run with its own message above and status 1.
wait_for_emulator() {
    local i f magic st deadline=$((SECONDS + 10))
    for ((i = 0; i < nodes; i++)); do
        f=$(win "$i")
        while :; do
            magic=$(od -An -tx4 -N4 "$f" 2>/dev/null | tr -d ' ')
            [ "$magic" = 45335843 ] && break
            if ! kill -0 "$emu_pid" 2>/dev/null; then
                st=0; wait "$emu_pid" || st=$?; emu_pid=""
                say "run-qemu.sh: cx3-emu exited (status $st) before serving the guests; not booting without the emulated HCA"
                exit 1
            fi
            if [ "$SECONDS" -ge "$deadline" ]; then
                say "run-qemu.sh: cx3-emu did not publish $f within 10 s; not booting"
                exit 1
            fi
            sleep 0.05
        done
    done
}

if [ "$hca" = 1 ]; then
    for ((i = 0; i < nodes; i++)); do
        truncate -s 16M "$(win $i)"
        truncate -s "$mem_bytes" "$(ram $i)"
    done
    "${emu_cmd[@]}" &
    emu_pid=$!
    wait_for_emulator
    case "$sm" in
        opensm) say "subnet manager: OpenSM, log ${sm_dir#"$here"/}/opensm.log (diags: scripts/ib-host.sh sminfo)" ;;
        embedded) say "subnet manager: the fabric's embedded SM (diags: scripts/ib-host.sh sminfo)" ;;
        none) say "subnet manager: none (ports stay Initializing; scripts/ib-host.sh opensm starts one)" ;;
    esac
fi
[ "$gdb" = 1 ] && say "QEMU waits for gdb: gdb $kernel -ex 'target remote :1234'"

status_of() { # QEMU exit status -> ours (scripts/nodes.sh; every node is our kernel)
    qemu_status "$1" lego
}

if [ "$nodes" = 1 ]; then
    qemu_cmd 0
    st=0
    if [ "$scripted" = 1 ]; then
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

# Several nodes (logdir: above, with the dry run).
if [ "$scripted" = 1 ]; then rm_logdir=$logdir; fi
mkdir -p "$logdir"
start_nodes "$logdir/node"
wait_nodes
# Every node's transcript, in node order, then which nodes failed.
if [ "$scripted" = 1 ]; then
    print_transcripts "$logdir/node"
    # CSV blocks the nodes printed, one file per node and name (docs/rmem.md).
    exp="$here/target/experiments/$(date -u +%Y%m%d-%H%M%S)-$run_id"
    for ((i = 0; i < nodes; i++)); do
        csv=$("$here/scripts/csv-collect.sh" "$logdir/node$i.log" "$exp" "node$i") ||
            say "run-qemu.sh: could not collect node $i's CSV into $exp"
        for f in $csv; do say "run-qemu.sh: node $i CSV: ${f#"$here"/}"; done
    done
    # The paging experiment's plot (docs/pcache.md), drawn on the host.
    for f in "$exp"/node*-pcache-experiment.csv; do
        [ -f "$f" ] || continue
        if plots=$("$here/scripts/pcache-plot.sh" "$f" "${f%.csv}.png"); then
            for p in $plots; do say "run-qemu.sh: plot: ${p#"$here"/}"; done
        else
            say "run-qemu.sh: could not plot $f"
        fi
    done
    report_failures run-qemu.sh
fi
exit "$worst"
