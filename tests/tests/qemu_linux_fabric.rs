//! End-to-end, real peers: Linux guests and ours on one emulated fabric.
//!
//! End-to-end, real peers on one emulated fabric: two unmodified Debian
//! Linux 6.1 guests (their own mlx4_core/mlx4_ib, rdma-core's libmlx4,
//! perftest and infiniband-diags) and one guest running our kernel, each on
//! a model HCA served by one `cx3-vfu` over vfio-user, with Debian's OpenSM
//! as the subnet manager (`run-qemu.sh --guests linux,linux,lego`).
//!
//! One boot does everything (TCG): OpenSM brings every port to Active; the
//! Linux guests run real perftest (`ib_write_bw`, `ib_read_lat`,
//! `ib_send_lat`, `ib_atomic_lat`), exchanging their QP details over a
//! QEMU `-netdev dgram` link between the two guests (no host network), so
//! libmlx4 builds the WQEs the model executes and rings its doorbells
//! through BAR2; `ibping` runs between the Linux guests; a Linux guest
//! reads our guest's port with `perfquery` and `smpquery`, and our guest
//! reads a Linux guest's port with `smpquery` (directed route) and the SM
//! with `sminfo`. The first run also downloads QEMU 11.1 and the guest's
//! Debian packages (about 130 MB, cached under `target/`).

use std::time::Duration;

use tests::qemu;

/// The deadline of the whole run (run-qemu.sh's --timeout, per guest).
const DEADLINE: Duration = Duration::from_secs(420);

/// Node GUID of cx3-vfu's node `i` (the fabric topology's HCA i).
fn node_guid(i: usize) -> u64 {
    sim::fabric::topology::hca_guid(i)
}

/// The transcript of node `n` in run-qemu.sh's multi-node output.
fn node(out: &str, n: usize) -> &str {
    qemu::node(out, n).unwrap_or("")
}

/// The lines after the command that starts with `cmd` (echoed as
/// `{prompt}{cmd}`: `# ` in a Linux guest, `lego> ` in ours) up to the
/// next command of `script` (a line `{prompt}{command}`; infiniband-diags
/// print lines starting with `# ` themselves).
fn after<'a>(t: &'a str, prompt: &str, cmd: &str, script: &str) -> &'a str {
    let Some(at) = t.find(&format!("{prompt}{cmd}")) else {
        return "";
    };
    let body = &t[at + prompt.len()..];
    let commands: Vec<String> = script
        .split(';')
        .map(|c| format!("{prompt}{}", c.trim()))
        .collect();
    let mut end = body.len();
    let mut off = body.find('\n').map_or(body.len(), |i| i + 1);
    while off < body.len() {
        let line = body[off..].lines().next().unwrap_or("");
        if commands.iter().any(|c| c == line) {
            end = off;
            break;
        }
        off += line.len() + 1;
    }
    &body[..end]
}

/// Node 0 (Linux): answers ibping (`ibping -S`), queries our guest's port
/// (perfquery, smpquery) and pings our kernel's responder, serves each
/// perftest, then stays up until our guest has powered off (its switch
/// port Down). Node 1 (Linux): pings node 0 (until all 3 answers come
/// back) and runs each perftest client, retrying while node 0's server is
/// not listening yet, then stays up the same way. Node 2 (ours): once the
/// Linux guests are up, reads node 1's NodeInfo and PortInfo by directed
/// route, its counters by LID (OpenSM's LIDs are seeded: the SM 1, the
/// switch 2, node i 3 + i), pings node 0's `ibping -S` (LID 3) and reads
/// the SM, then stays up a little for node 0's queries. Our console has no
/// wait-for-a-peer command, so this part goes by time: 120 s for the Linux
/// guests to boot and for node 0 to query our port and ping our
/// responder, which answers from the progress loop our `sleep` runs.
const LINUX_SERVER: &str = "wait-active 120; ibping -S >/dev/null 2>&1 &; ibstat; \
     lid=$(peer-lid 3) && perfquery $lid && smpquery nodeinfo $lid && smpquery portinfo $lid; \
     lid=$(peer-lid 3) && retry 10 expect 3.received ibping -c 3 $lid; \
     timeout 120 ib_write_bw -n 20 -s 4096; timeout 120 ib_read_lat -n 20; \
     timeout 120 ib_send_lat -n 20; timeout 120 ib_atomic_lat -n 20; wait-down 3 300";
const LINUX_CLIENT: &str = "wait-active 120; \
     lid=$(peer-lid 1) && retry 20 expect 3.received ibping -c 3 $lid; \
     retry 20 timeout 60 ib_write_bw -n 20 -s 4096 10.0.0.1; \
     retry 20 timeout 60 ib_read_lat -n 20 10.0.0.1; \
     retry 20 timeout 60 ib_send_lat -n 20 10.0.0.1; \
     retry 20 timeout 60 ib_atomic_lat -n 20 10.0.0.1; \
     for i in 1 2 3; do echo tick $i; done; wait-down 3 300";
const OURS: &str = "sleep 120; ibstat; smpquery -D nodeinfo 0,1,2; smpquery -D portinfo 0,1,2; \
     perfquery 4; ibping -c 3 3; sminfo; sleep 20";

#[test]
fn linux_guests_and_ours_share_one_fabric_under_opensm() {
    let r = qemu::run_vfu(
        &[
            "--guests",
            "linux,linux,lego",
            "--emu-args",
            "--stats",
            "--run-on",
            "0",
            LINUX_SERVER,
            "--run-on",
            "1",
            LINUX_CLIENT,
            "--run-on",
            "2",
            OURS,
        ],
        DEADLINE,
        true,
    );
    check(r.status, &r.transcript, &r.stderr);
}

/// What the run must show (the transcripts on stdout, cx3-vfu's and
/// run-qemu.sh's messages on stderr).
fn check(status: i32, console: &str, vfu: &str) {
    // The model's verdict lines first: a failure message is often cut short.
    let verdict: String = vfu
        .lines()
        .filter(|l| {
            ["violation", "DMA fault", "total:", "exiting", "vfu-run.sh"]
                .iter()
                .any(|k| l.contains(k))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let all = format!(
        "--- cx3-vfu verdict ---\n{verdict}--- consoles ---\n{console}\n--- cx3-vfu and run-qemu.sh ---\n{vfu}"
    );
    assert_eq!(status, 0, "a command failed:\n{all}");
    // The model saw nothing wrong from any of the three drivers.
    assert!(
        vfu.contains("total: commands") && vfu.contains("violations 0, DMA faults 0; CPU"),
        "cx3-vfu recorded violations or DMA faults:\n{all}"
    );
    assert!(
        !vfu.contains("violation:") && !vfu.contains("DMA fault:"),
        "{all}"
    );
    let (n0, n1, n2) = (node(console, 0), node(console, 1), node(console, 2));
    let lin0 = |cmd| after(n0, "# ", cmd, LINUX_SERVER);
    let lin1 = |cmd| after(n1, "# ", cmd, LINUX_CLIENT);
    let ours = |cmd| after(n2, "lego> ", cmd, OURS);

    // OpenSM brought every port to Active, with its host (LID 1) as the SM.
    for t in [n0, n1] {
        assert!(t.contains("port 1 Active: LID 0x"), "{all}");
    }
    let ibstat = lin0("ibstat");
    assert!(ibstat.contains("State: Active"), "{all}");
    assert!(
        ibstat.contains("SM lid: 1"),
        "OpenSM's host is LID 1:\n{all}"
    );
    assert!(ours("ibstat").contains("State: Active"), "our port:\n{all}");
    assert!(ours("sminfo").contains("sminfo: sm lid 1 "), "{all}");

    // A Linux guest reads our guest's port: PMA counters and SMA records.
    let q = lin0("lid=$(peer-lid 3)");
    assert!(q.contains("PortXmitData:"), "perfquery of our port:\n{all}");
    assert!(
        q.contains(&format!(
            "Guid:............................0x{:016x}",
            node_guid(2)
        )),
        "smpquery nodeinfo of our port:\n{all}"
    );
    assert!(
        q.contains("LinkState:.......................Active"),
        "{all}"
    );
    // ... and our guest reads a Linux guest's, by directed route.
    assert!(
        ours("smpquery -D nodeinfo 0,1,2").contains(&format!(
            "Guid:............................0x{:016x}",
            node_guid(1)
        )),
        "our smpquery of Linux node 1:\n{all}"
    );
    assert!(
        ours("smpquery -D portinfo 0,1,2").contains("LinkState:.......................Active"),
        "{all}"
    );

    assert!(
        ours("perfquery 4").contains("PortXmitData"),
        "our perfquery of Linux node 1 (LID 4):\n{all}"
    );

    // ibping between Linux and our kernel, both ways: Linux's client to
    // our kernel's responder, our client to Linux's `ibping -S`.
    assert!(
        lin0("lid=$(peer-lid 3) && retry 10 expect").contains("3 packets transmitted, 3 received"),
        "Linux's ibping of our guest:\n{all}"
    );
    assert!(
        ours("ibping -c 3 3").contains("3 packets transmitted, 3 received"),
        "our ibping of Linux node 0:\n{all}"
    );

    // ibping between the Linux guests: every ping answered.
    assert!(
        lin1("lid=$(peer-lid 1)").contains("3 packets transmitted, 3 received"),
        "ibping:\n{all}"
    );

    // A loop is one command (the guest's splitter keeps compound commands
    // whole).
    assert!(
        lin1("for i in 1 2 3; do echo tick $i; done").contains("tick 1\ntick 2\ntick 3\n"),
        "{all}"
    );
    // Our guest's power-off took its link down (cx3-vfu resets the
    // function of a client that has gone).
    assert!(
        lin1("wait-down 3").contains("switch port 3 is Down"),
        "{all}"
    );

    // Real perftest between the Linux guests, both sides reporting.
    let row = " 4096       20 ";
    assert!(lin0("timeout 120 ib_write_bw").contains(row), "{all}");
    assert!(
        lin1("retry 20 timeout 60 ib_write_bw").contains(row),
        "{all}"
    );
    for tool in ["ib_read_lat", "ib_send_lat", "ib_atomic_lat"] {
        let cmd = format!("retry 20 timeout 60 {tool}");
        let c = after(n1, "# ", &cmd, LINUX_CLIENT);
        assert!(c.contains("t_avg[usec]"), "{tool} result:\n{all}");
    }
}

/// Two Linux guests whose UAR pages QEMU maps from cx3-vfu's file:
/// libmlx4's send doorbells are plain stores, so real perftest runs with
/// no BAR2 message reaching cx3-vfu (`--stats`: "BAR2 0 (mapped: N polls
/// took doorbells)"), the model taking each doorbell from the pages, no
/// violation, and both sides reporting.
#[test]
fn linux_doorbells_are_stores_into_the_mapped_uar_pages() {
    const SERVER: &str = "wait-active 60; timeout 60 ib_write_bw -s 65536 -n 300; \
         timeout 60 ib_write_lat -s 8 -n 200";
    const CLIENT: &str = "wait-active 60; \
         retry 20 timeout 30 ib_write_bw -s 65536 -n 300 10.0.0.1; \
         retry 20 timeout 30 ib_write_lat -s 8 -n 200 10.0.0.1";
    let r = qemu::run_vfu(
        &[
            "--linux",
            "--nodes",
            "2",
            "--emu-args",
            "--stats",
            "--run-on",
            "0",
            SERVER,
            "--run-on",
            "1",
            CLIENT,
        ],
        Duration::from_secs(110),
        true,
    );
    let all = format!("{}\n--- cx3-vfu ---\n{}", r.transcript, r.stderr);
    assert_eq!(r.status, 0, "{all}");
    let (n0, n1) = (node(&r.transcript, 0), node(&r.transcript, 1));
    let row = " 65536      300 ";
    assert!(
        after(n0, "# ", "timeout 60 ib_write_bw", SERVER).contains(row),
        "{all}"
    );
    assert!(
        after(n1, "# ", "retry 20 timeout 30 ib_write_bw", CLIENT).contains(row),
        "{all}"
    );
    assert!(
        after(n1, "# ", "retry 20 timeout 30 ib_write_lat", CLIENT).contains("t_avg[usec]"),
        "{all}"
    );
    for n in 0..2 {
        let a = qemu::vfu_accesses(&r.stderr, n);
        assert_eq!(
            qemu::count_after(a, "BAR2 "),
            Some(0),
            "node {n}: {a}\n{all}"
        );
        assert!(
            qemu::count_after(a, "mapped: ").is_some_and(|p| p > 0),
            "node {n}: doorbells taken from the pages: {a}\n{all}"
        );
    }
    assert!(
        r.stderr.contains("total: commands") && r.stderr.contains("violations 0, DMA faults 0;"),
        "{all}"
    );
}

#[test]
fn transcript_helpers_split_nodes_and_commands() {
    let out = "===== node 0 (linux, exit 0) =====\n# a\nA\n# b x\nB\n===== node 1 (lego, exit 0) =====\n# a\nC\n";
    let script = "a; b x";
    assert_eq!(after(node(out, 0), "# ", "b", script), "b x\nB\n");
    assert_eq!(after(node(out, 0), "# ", "a", script), "a\nA\n");
    assert_eq!(after(node(out, 1), "# ", "a", script), "a\nC\n");
    // A diag's own "# " heading is output, not the next command.
    let diag = "# a\n# Port counters: Lid 3\nX\n# b x\n";
    assert_eq!(
        after(diag, "# ", "a", script),
        "a\n# Port counters: Lid 3\nX\n"
    );
    assert_eq!(
        after("lego> x\n1\nlego> y\n", "lego> ", "x", "x; y"),
        "x\n1\n"
    );
    assert_eq!(node(out, 2), "");
}
