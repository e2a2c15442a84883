//! The console tools between two QEMU guests on one emulated fabric.
//!
//! The console tools between two QEMU guests on one emulated fabric (`run-qemu.sh
//! --nodes 2` with its default subnet manager, Debian's OpenSM attached through
//! ibsim's protocol): every perftest tool with `--check` and both pingpongs in one
//! boot (so also a second, third, ... CM connection per boot), perfquery on one
//! guest showing the other's counters grow by the bytes moved, smpquery and
//! ibnetdiscover listing the switch and the other guest, ibping answered; in a
//! second boot, packet drops recovered by RC retransmission and a pulled cable
//! ending in "transport retry counter exceeded".
//!
//! The scripts are sequenced by the console's `retry`: node 0 serves one
//! tool after the other; node 1 runs each client under `retry` ([`RETRY`]),
//! so a client that comes before the subnet is up or before node 0 listens
//! again (node 0's CM rejects its REQ) is run again a second later. OpenSM
//! picks the LIDs, so node 1 names node 0 by its port GUID everywhere
//! (`-G` for perfquery, smpquery and ibping, the GUID as the
//! perftest/pingpong peer), resolved through the SA.

use std::time::Duration;

use tests::qemu;

/// Node 0's port GUID (cx3-emu's `--nodes` numbering).
const NODE0_GUID: &str = "0x0002c90300000011";

/// How node 1 runs a client: again a second later while it fails, 30
/// tries at most (the first one may come before the subnet is up).
const RETRY: &str = "retry -n 30 -i 1";

/// Node 0's and node 1's transcripts of a two-node run.
fn node_transcripts(t: &str) -> (&str, &str) {
    let node = |n| qemu::node(t, n).unwrap_or("");
    (node(0), node(1))
}

/// The value of a `Name:....value` line, the `k`-th time it appears.
fn counter(t: &str, name: &str, k: usize) -> Option<u64> {
    t.lines()
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            (n == name).then(|| v.trim_start_matches('.').trim().parse().ok())?
        })
        .nth(k)
}

/// The result line after a tool's header in the client's transcript.
fn result_after<'a>(t: &'a str, cmd: &str, header: &str) -> Option<&'a str> {
    let at = t.find(&format!("lego> {cmd}"))?;
    let rest = &t[at..];
    let h = rest.find(header)?;
    rest[h..].lines().nth(1)
}

#[test]
fn perftest_pingpong_and_diags_between_two_guests() {
    let g = NODE0_GUID;
    let tools = [
        ("ib_write_bw", "-s 8192 -n 100"),
        ("ib_read_bw", "-s 8192 -n 100"),
        ("ib_send_bw", "-s 8192 -n 100"),
        ("ib_write_lat", "-s 8 -n 200"),
        ("ib_read_lat", "-s 8 -n 200"),
        ("ib_send_lat", "-s 8 -n 200"),
        ("ib_atomic_lat", "-n 200"),
    ];
    let mut server: Vec<String> = tools.iter().map(|(t, _)| format!("{t} --check")).collect();
    server.extend([
        "ibv_rc_pingpong --chk".to_string(),
        "ibv_ud_pingpong -c".to_string(),
        "ib_write_bw".to_string(),
        "sleep 25".to_string(),
    ]);
    let mut client = Vec::new();
    for (t, a) in tools {
        client.push(format!("{RETRY} {t} --check {a} {g}"));
    }
    client.extend([
        format!("{RETRY} ibv_rc_pingpong --chk -n 100 {g}"),
        format!("{RETRY} ibv_ud_pingpong -c -n 100 {g}"),
        format!("perfquery -G {g} 1"),
        format!("{RETRY} ib_write_bw -s 65536 -n 100 {g}"),
        format!("perfquery -G {g} 1"),
        format!("ibping -c 3 -G {g}"),
        format!("smpquery -G nodedesc {g}"),
        "smpquery -D nodeinfo 0,1".to_string(),
        "ibnetdiscover".to_string(),
    ]);
    let (s, c) = (server.join("; "), client.join("; "));
    let r = qemu::run(
        &s,
        &["--nodes", "2", "--run-on", "1", &c],
        Duration::from_secs(240),
    );
    let (t0, t1) = node_transcripts(&r.transcript);
    assert_eq!(r.status, 0, "{}\n{}", r.transcript, r.stderr);
    // Node 0's LID, as its first server says it.
    let lid0: u16 = t0
        .split("(LID ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("node 0's LID: {t0}"));
    for (t, a) in tools {
        let header = if t.ends_with("_bw") {
            ib_tools::perftest::RESULT_FMT
        } else {
            ib_tools::perftest::RESULT_FMT_LAT
        };
        let line = result_after(t1, &format!("{RETRY} {t} --check {a}"), header)
            .unwrap_or_else(|| panic!("{t}: no result line\n{t1}"));
        let iters = a.split_whitespace().last().unwrap_or("");
        assert_eq!(line.split_whitespace().nth(1), Some(iters), "{t}: {line:?}");
        println!("{t} --check {a}: {line}");
    }
    for tool in ["ibv_rc_pingpong", "ibv_ud_pingpong"] {
        let at = t1.find(&format!("lego> {RETRY} {tool}")).expect(tool);
        let rest = &t1[at..];
        let line = rest
            .lines()
            .find(|l| l.contains(" iters in "))
            .unwrap_or_else(|| panic!("{tool}: no result\n{t1}"));
        assert!(line.starts_with("100 iters in "), "{tool}: {line}");
        println!("{tool}: {line}");
    }
    // perfquery of node 0 before and after 100 x 64 KiB written into it.
    let before = counter(t1, "PortRcvData", 0).expect("first perfquery");
    let after = counter(t1, "PortRcvData", 1).expect("second perfquery");
    let words = 100 * 65536 / 4;
    let grew = after.wrapping_sub(before);
    assert!(
        grew >= words && grew < words + words / 10,
        "PortRcvData grew by {grew} words for {words} words written ({before} -> {after})"
    );
    assert!(
        t1.contains("Pong from ") && t1.contains(&format!(" (Lid {lid0}): time ")),
        "{t1}"
    );
    assert!(
        t1.contains("3 packets transmitted, 3 received, 0% packet loss"),
        "{t1}"
    );
    assert!(t1.contains("Node Description:."), "{t1}");
    assert!(
        t1.contains("NodeType:........................Switch"),
        "smpquery -D 0,1 reaches the switch: {t1}"
    );
    // ibnetdiscover from node 1: the switch, node 0 on its port 1.
    assert!(t1.contains("Switch\t36 \"S-"), "{t1}");
    assert!(
        t1.contains(&format!(
            "[1]\t\"H-0002c90300000010\"[1](2c90300000011) \t\t# \"MT25408 ConnectX Mellanox Technologies\" lid {lid0} 4x"
        )),
        "node 0 behind switch port 1: {t1}"
    );
    assert!(
        t1.contains(&format!("# Port counters: Lid {lid0} port 1")),
        "{t1}"
    );
    assert!(t1.contains("caguid=0x2c90300000010"), "{t1}");
}

#[test]
fn drops_are_recovered_and_a_pulled_cable_ends_in_retry_exceeded() {
    let g = NODE0_GUID;
    // The long run, whose failure is the point, is not retried (a retry
    // would wait for the pulled cable's port): a second after the first.
    let c = format!(
        "{RETRY} ib_write_bw --check -s 65536 -n 100 {g}; sleep 1; ib_write_bw -s 65536 -n 1000000 {g}"
    );
    let emu = "--drop opcode=0x07,every=13,times=6 --drop opcode=0x11,every=7,times=6 --pull node1/1@64MiB";
    let r = qemu::run(
        "ib_write_bw --check; ib_write_bw",
        &["--nodes", "2", "--emu-args", emu, "--run-on", "1", &c],
        Duration::from_secs(180),
    );
    let (t0, t1) = node_transcripts(&r.transcript);
    // The first run completes through the drops (retransmissions).
    let line = result_after(
        t1,
        &format!("{RETRY} ib_write_bw --check -s 65536 -n 100"),
        ib_tools::perftest::RESULT_FMT,
    )
    .unwrap_or_else(|| panic!("the run with drops completes\n{t1}\n{}", r.stderr));
    println!("with drops: {line}");
    // The second one loses its cable: the transport retry status. The
    // cable goes once 64 MiB have crossed it, well after the first run's
    // 6.25 MiB: inside the long run however slowly the machine gets there.
    let long = t1
        .find("lego> ib_write_bw -s 65536 -n 1000000")
        .map_or("", |i| &t1[i..]);
    assert!(
        long.contains(" #bytes "),
        "the long run had not started when the cable was pulled (after 64 MiB)\n{long}"
    );
    assert!(
        t1.contains("transport retry counter exceeded"),
        "{t1}\n{}",
        r.stderr
    );
    assert!(t1.contains("===== node 1 (exit 1) ====="), "{t1}");
    // The server gives up on its deadline (no completion for 10 s).
    assert!(t0.contains("no completion for 10 s"), "{t0}");
    assert_eq!(r.status, 1, "{}", r.stderr);
}
