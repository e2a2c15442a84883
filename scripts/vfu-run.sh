#!/usr/bin/env bash
# Boots guests against the model served as PCI functions over vfio-user
# (cx3-vfu, docs/vfio-user.md), all on one emulated fabric with its subnet
# manager: `run-qemu.sh --linux` (Debian's Linux 6.1 with its own mlx4 stack
# and rdma-core, built by scripts/linux-guest.sh), `run-qemu.sh --vfu` (our
# kernel, probing the function as a plain PCI device: the path a
# passed-through card takes), and mixed fabrics (`--guests linux,linux,lego`)
# come here.
#
#   scripts/vfu-run.sh --linux|--vfu|--guests KIND,KIND,... [--nodes N]
#       [--run "cmd; cmd"] [--run-on N "cmd; cmd"]... [--timeout SEC]
#       [--memory SIZE] [--append TEXT] [--sm opensm|embedded|none]
#       [--emu-args "cx3-vfu options"]
#       [--dry-run] [--no-build] [--vfu-log FILE] [-- QEMU args]
#
# --run works as for our kernel: the guest runs the commands (Linux: each
# `;`-separated command through its shell), prints the transcript, and the
# status is 0 only if every command succeeded, 124 on the deadline; --run-on
# gives node N its own. With several nodes every transcript is printed at the
# end, node by node. The first two Linux guests are joined by a point-to-point
# Ethernet link (QEMU `-netdev dgram` over UNIX sockets: no host network),
# addresses 10.0.0.<node+1>/24, for perftest's exchange of QP details.
# cx3-vfu's messages (violations, DMA faults, --trace, where OpenSM's log is)
# go to stderr, or to --vfu-log. QEMU runs under TCG (KVM hangs this machine
# kind's nested guests early).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/deps.sh
. "$here/scripts/deps.sh"
# shellcheck source=scripts/nodes.sh
. "$here/scripts/nodes.sh"

kinds=(); nodes=""; sm=""; run=""; timeout_s=180; memory=1G; append=""; emu_args=""; dry=0; build=1
vfu_log=""; qemu_extra=(); declare -A run_on=()
while [ $# -gt 0 ]; do
    case "$1" in
        --linux) kinds=(linux) ;;
        --vfu) kinds=(lego) ;;
        --guests)
            IFS=, read -r -a kinds <<<"${2?--guests needs a list}"; shift
            for k in "${kinds[@]}"; do
                case "$k" in linux|lego) ;; *) say "vfu-run.sh: --guests takes linux and lego, not '$k'"; exit 2 ;; esac
            done ;;
        --nodes) nodes=${2?--nodes needs a number}; shift ;;
        --run) run=${2?--run needs commands}; shift ;;
        --run-on)
            [ $# -ge 3 ] || { say "vfu-run.sh: --run-on needs a node and commands"; exit 2; }
            run_on[$2]=$3; shift 2 ;;
        --timeout) timeout_s=${2?--timeout needs seconds}; shift ;;
        --memory) memory=${2?--memory needs a size}; shift ;;
        --append) append=${2?--append needs text}; shift ;;
        --emu-args) emu_args=${2?--emu-args needs options}; shift ;;
        --sm)
            case "${2:-}" in opensm|embedded|none) sm=$2 ;; *) say "vfu-run.sh: --sm takes opensm, embedded or none"; exit 2 ;; esac
            shift ;;
        --vfu-log) vfu_log=${2?--vfu-log needs a file}; shift ;;
        --dry-run) dry=1 ;;
        --no-build) build=0 ;;
        --) shift; qemu_extra=("$@"); break ;;
        *) say "vfu-run.sh: unknown option '$1'"; exit 2 ;;
    esac
    shift
done
[ ${#kinds[@]} -gt 0 ] || { say "vfu-run.sh: --linux, --vfu or --guests is required"; exit 2; }
if [ -n "$nodes" ]; then
    [[ "$nodes" =~ ^[1-8]$ ]] || { say "vfu-run.sh: --nodes takes 1 to 8"; exit 2; }
    [ ${#kinds[@]} = 1 ] || [ ${#kinds[@]} = "$nodes" ] || { say "vfu-run.sh: --guests names ${#kinds[@]} guests, --nodes $nodes"; exit 2; }
    if [ ${#kinds[@]} = 1 ]; then k=${kinds[0]}; kinds=(); for ((i = 0; i < nodes; i++)); do kinds+=("$k"); done; fi
fi
nodes=${#kinds[@]}
[ "$nodes" -le 8 ] || { say "vfu-run.sh: at most 8 guests"; exit 2; }
[[ "$timeout_s" =~ ^[0-9]+$ ]] || { say "vfu-run.sh: --timeout wants seconds"; exit 2; }
for k in "${!run_on[@]}"; do
    [[ "$k" =~ ^[0-7]$ ]] && [ "$k" -lt "$nodes" ] || { say "vfu-run.sh: --run-on $k: there are $nodes node(s)"; exit 2; }
done
scripted=0
{ [ -n "$run" ] || [ ${#run_on[@]} -gt 0 ]; } && scripted=1
if [ ${#run_on[@]} -gt 0 ] && [ -z "$run" ]; then
    for ((i = 0; i < nodes; i++)); do
        [ -n "${run_on[$i]+x}" ] || { say "vfu-run.sh: node $i has no script (--run-on $i or --run)"; exit 2; }
    done
fi
node_run() { if [ -n "${run_on[$1]+x}" ]; then echo "${run_on[$1]}"; else echo "$run"; fi; }
for ((i = 0; i < nodes; i++)); do
    case "$(node_run $i)" in *\"*) say "vfu-run.sh: --run commands cannot contain double quotes"; exit 2 ;; esac
done

vfu="$here/target/emu/release/cx3-vfu"
kernel="$here/target/kernel/x86_64-target/release/kernel"
if [ "$build" = 1 ] && [ "$dry" = 0 ]; then
    ensure_rust
    (cd "$here" && CARGO_TARGET_DIR="$here/target/emu" cargo build --release --quiet -p sim --bin cx3-vfu)
fi
linux=0
for k in "${kinds[@]}"; do [ "$k" = linux ] && linux=1; done

if [ "$dry" = 1 ]; then
    qemu=$("$here/scripts/qemu-vfu.sh" --check >/dev/null 2>&1 && "$here/scripts/qemu-vfu.sh" || echo qemu-system-x86_64)
    img="$here/target/linux-guest/image"
else
    qemu=$("$here/scripts/qemu-vfu.sh")
    img=""
    [ "$linux" = 1 ] && img=$("$here/scripts/linux-guest.sh")
    # OpenSM (cx3-vfu's default SM) and the umad2sim preload.
    case " ${sm:+--sm $sm }$emu_args " in *" --sm embedded "*|*" --sm none "*|*" --embedded-sm "*|*" --sm=embedded "*|*" --sm=none "*) ;;
        *) ensure_ib_peers ;; esac
fi

run_dir="${TMPDIR:-/tmp}/cx3-vfu-run-$$"
sock() { echo "$run_dir/node$1.sock"; }
vfu_cmd=("$vfu" --exit-with-parent --sm-dir "$here/target/fabric/vfu-$$/opensm"
         --sockname-file "$here/target/fabric/ibsim-sockname")
for ((i = 0; i < nodes; i++)); do vfu_cmd+=(--socket "$(sock $i)"); done
[ -n "$sm" ] && vfu_cmd+=(--sm "$sm")
# shellcheck disable=SC2206 # word splitting of the user's options is intended
vfu_cmd+=($emu_args)

# The Ethernet link between the first two Linux guests (-netdev dgram).
net_nodes=()
for ((i = 0; i < nodes; i++)); do
    [ "${kinds[$i]}" = linux ] && [ ${#net_nodes[@]} -lt 2 ] && net_nodes+=("$i")
done
[ ${#net_nodes[@]} = 2 ] || net_nodes=()

qemu_cmd() { # node -> fills the array `q`
    local n=$1 cmdline r peer
    r=$(node_run "$n")
    # shellcheck disable=SC2054 # the commas belong to QEMU's option syntax
    q=("$qemu" -accel tcg -cpu max -m "$memory"
       -object "memory-backend-memfd,id=ram0,size=$memory,share=on" -machine q35,memory-backend=ram0
       -display none -no-reboot -device isa-debug-exit,iobase=0xf4,iosize=4
       -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$(sock "$n")\",\"type\":\"unix\"}}")
    if [ ${#net_nodes[@]} = 2 ] && { [ "$n" = "${net_nodes[0]}" ] || [ "$n" = "${net_nodes[1]}" ]; }; then
        if [ "$n" = "${net_nodes[0]}" ]; then peer=${net_nodes[1]}; else peer=${net_nodes[0]}; fi
        q+=(-netdev "dgram,id=n0,local.type=unix,local.path=$run_dir/eth$n,remote.type=unix,remote.path=$run_dir/eth$peer"
            -device "e1000,netdev=n0,mac=52:54:00:00:00:$(printf %02x $((n + 1)))")
        append_net=" ipaddr=10.0.0.$((n + 1))"
    else
        q+=(-net none)
        append_net=""
    fi
    if [ "${kinds[$n]}" = linux ]; then
        # no_timer_check: on a loaded host TCG can miss Linux's boot-time
        # check of the timer interrupt ("IO-APIC + timer doesn't work!").
        cmdline="console=ttyS0 quiet panic=-1 no_timer_check${append:+ $append}$append_net"
        [ -n "$r" ] && cmdline="$cmdline run=\"$r\""
        q+=(-kernel "$img/vmlinuz" -initrd "$img/initrd.cpio.gz" -append "$cmdline")
    else
        cmdline="$append"
        [ -n "$r" ] && cmdline="${cmdline:+$cmdline }run=\"$r\""
        q+=(-kernel "$kernel" -append "$cmdline")
    fi
    q+=("${qemu_extra[@]}")
}

# Several nodes: node 0 interactive unless scripted; the others log to files.
# Scripted runs may run side by side: their consoles go to the run's own
# directory (removed with it).
if [ "$scripted" = 1 ]; then logdir="$run_dir"; else logdir="$here/target/nodes"; fi

if [ "$dry" = 1 ]; then
    printf '%q ' "${vfu_cmd[@]}"; echo
    for ((i = 0; i < nodes; i++)); do
        qemu_cmd "$i"
        # The console the run gives the node (one node: this terminal).
        if [ "$nodes" -gt 1 ]; then
            q+=(-serial "$(node_serial "$logdir/vfu-node" "$i")")
        elif [ "$scripted" = 1 ]; then
            q+=(-serial stdio)
        else
            q+=(-serial mon:stdio)
        fi
        printf '%q ' "${q[@]}"; echo
    done
    exit 0
fi
[ -x "$vfu" ] || { say "vfu-run.sh: $vfu is not built (run without --no-build)"; exit 1; }
for k in "${kinds[@]}"; do
    [ "$k" = lego ] && { [ -f "$kernel" ] || { say "vfu-run.sh: $kernel is not built"; exit 1; }; }
done

vfu_pid=""; qemu_pids=()
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
    local p
    for p in "${qemu_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ -n "$vfu_pid" ]; then kill "$vfu_pid" 2>/dev/null || true; fi
    for p in "${qemu_pids[@]}" $vfu_pid; do wait "$p" 2>/dev/null || true; done
    rm -rf "$run_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$run_dir"
mkdir -p "$run_dir" "$here/target/fabric"
if [ -n "$vfu_log" ]; then "${vfu_cmd[@]}" 2>"$vfu_log" & else "${vfu_cmd[@]}" & fi
vfu_pid=$!
for ((i = 0; i < nodes; i++)); do
    for _ in $(seq 200); do
        [ -S "$(sock $i)" ] && break
        kill -0 "$vfu_pid" 2>/dev/null || { say "vfu-run.sh: cx3-vfu exited early"; exit 1; }
        sleep 0.05
    done
    [ -S "$(sock $i)" ] || { say "vfu-run.sh: cx3-vfu did not create $(sock $i) within 10 s"; exit 1; }
done

status_of() { # QEMU exit status of node N -> ours (scripts/nodes.sh, by the node's kind)
    qemu_status "$1" "${kinds[${2:-0}]}"
}

if [ "$nodes" = 1 ]; then
    qemu_cmd 0
    st=0
    if [ "$scripted" = 1 ]; then
        # QEMU's vfio-user client reports harmless notes on stderr; keep them
        # apart from the guest's transcript only by stream.
        q+=(-serial stdio)
        timeout -k 5 "$timeout_s" "${q[@]}" </dev/null &
    else
        q+=(-serial mon:stdio)
        "${q[@]}" <&0 &
    fi
    qemu_pids=($!)
    wait "${qemu_pids[0]}" || st=$?
    qemu_pids=()
    # Let cx3-vfu see the client go and report (--stats).
    for _ in $(seq 60); do kill -0 "$vfu_pid" 2>/dev/null || break; sleep 0.05; done
    st0=$st
    st=$(status_of "$st" 0)
    if [ "$st0" = 0 ] && [ "$st" != 0 ]; then
        say "vfu-run.sh: the guest stopped without reporting a result (a panic or a reboot)"
    fi
    [ "$st" = 124 ] && say "vfu-run.sh: QEMU did not finish within ${timeout_s}s"
    exit "$st"
fi

# Several nodes (logdir: above, with the dry run).
mkdir -p "$logdir"
start_nodes "$logdir/vfu-node"
wait_nodes
for _ in $(seq 60); do kill -0 "$vfu_pid" 2>/dev/null || break; sleep 0.05; done
if [ "$scripted" = 1 ]; then
    print_transcripts "$logdir/vfu-node" "${kinds[@]}"
    report_failures vfu-run.sh
fi
exit "$worst"
