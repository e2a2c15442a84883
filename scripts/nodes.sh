# shellcheck shell=bash disable=SC2154 # nodes, scripted, timeout_s: the caller's
# Several guests at once: starting one QEMU per node, waiting for them all
# and printing what they did. Sourced by run-qemu.sh and scripts/vfu-run.sh,
# which differ only in how a node's QEMU is built and what its exit status
# means. The caller provides:
#   qemu_cmd N     fills the array `q` with node N's QEMU (no -serial)
#   status_of ST N QEMU's exit status of node N -> the run's (both scripts
#                  map it with qemu_status below)
#   nodes, scripted (1: every node runs a script), timeout_s, and the array
#   qemu_pids, which its EXIT trap ends.

# node_serial LOG I: the -serial value start_nodes LOG gives node I: the
# file LOG<I>.log, except node 0's console in an interactive run (this
# terminal, with QEMU's monitor). A dry run prints the same.
node_serial() {
    if [ "$scripted" = 1 ] || [ "$2" != 0 ]; then echo "file:$1$2.log"; else echo mon:stdio; fi
}

# qemu_status ST KIND: QEMU's exit status for a guest of KIND (lego: our
# kernel; linux) -> the run's, on the ivshmem and vfio-user paths alike.
# A guest reports through isa-debug-exit: 33 (success) is 0, 35 (failure)
# 1; 124 or 137 is the deadline (timeout), 124. QEMU's own 0 (-no-reboot
# turns a reset into an exit) means what the guest makes it mean: our
# kernel reports every crash through isa-debug-exit, so its 0 is its
# `reboot` command and a success; a scripted Linux guest always leaves
# through isa-debug-exit and panic=-1 turns a panic into a reset, so its 0
# is a failure (it stopped without reporting).
qemu_status() {
    case $1 in
        33) echo 0 ;; 35) echo 1 ;; 124|137) echo 124 ;;
        0) if [ "$2" = linux ] && [ "$scripted" = 1 ]; then echo 1; else echo 0; fi ;;
        *) echo "$1" ;;
    esac
}

# start_nodes LOG: boots node N-1 down to node 0, appending their pids to
# qemu_pids. Node I's console goes to the file LOG<I>.log, except node 0's
# in an interactive run (this terminal). Scripted nodes run under the
# deadline.
start_nodes() {
    local log=$1 i f
    for ((i = nodes - 1; i >= 0; i--)); do
        qemu_cmd "$i"
        f="$log$i.log"
        rm -f "$f"
        q+=(-serial "$(node_serial "$log" "$i")")
        if [ "$scripted" = 1 ]; then
            timeout -k 5 "$timeout_s" "${q[@]}" </dev/null &
        elif [ "$i" = 0 ]; then
            # A background job of a script reads /dev/null unless told otherwise.
            "${q[@]}" <&0 &
        else
            "${q[@]}" </dev/null &
            say "node $i: serial console logged to $f"
        fi
        qemu_pids+=($!)
    done
}

# wait_nodes: waits for every QEMU start_nodes started; sets node_st[I]
# (status_of each) and worst (the first failing node's to end, else 0).
wait_nodes() {
    local k st
    worst=0
    node_st=()
    for ((k = 0; k < nodes; k++)); do
        st=0
        wait "${qemu_pids[$k]}" || st=$?
        st=$(status_of "$st" $((nodes - 1 - k)))
        node_st[nodes - 1 - k]=$st
        [ "$st" != 0 ] && [ "$worst" = 0 ] && worst=$st
    done
    qemu_pids=()
}

# print_transcripts LOG [KIND...]: every node's console (the files of
# start_nodes LOG), in node order, each under a `===== node I (exit S) =====`
# line (`(KIND, exit S)` when the nodes' kinds are given).
print_transcripts() {
    local log=$1 i kinds=("${@:2}")
    for ((i = 0; i < nodes; i++)); do
        echo "===== node $i (${kinds[i]:+${kinds[i]}, }exit ${node_st[i]}) ====="
        cat "$log$i.log" 2>/dev/null || true
    done
}

# report_failures NAME: says, as NAME, which nodes failed or ran out of time.
report_failures() {
    local i
    for ((i = 0; i < nodes; i++)); do
        case ${node_st[i]} in
            0) ;;
            124) say "$1: node $i did not finish within ${timeout_s}s" ;;
            *) say "$1: node $i failed (exit ${node_st[i]})" ;;
        esac
    done
}
