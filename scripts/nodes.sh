# shellcheck shell=bash disable=SC2154 # nodes, scripted, timeout_s: the caller's
# Several guests at once: starting one QEMU per node, waiting for them all
# and printing what they did. Sourced by run-qemu.sh and scripts/vfu-run.sh,
# which differ only in how a node's QEMU is built and what its exit status
# means. The caller provides:
#   qemu_cmd N     fills the array `q` with node N's QEMU (no -serial)
#   status_of ST   QEMU's exit status -> the run's
#   nodes, scripted (1: every node runs a script), timeout_s, and the array
#   qemu_pids, which its EXIT trap ends.

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
        if [ "$scripted" = 1 ]; then
            q+=(-serial "file:$f")
            timeout -k 5 "$timeout_s" "${q[@]}" </dev/null &
        elif [ "$i" = 0 ]; then
            q+=(-serial mon:stdio)
            # A background job of a script reads /dev/null unless told otherwise.
            "${q[@]}" <&0 &
        else
            q+=(-serial "file:$f")
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
        st=$(status_of "$st")
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
