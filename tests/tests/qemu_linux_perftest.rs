//! perftest between an unmodified Linux 6.1 guest (Debian bookworm's perftest 4.5-0.17) and ours, over perftest's TCP exchange and with `-R` (rdma_cm) on IPoIB, each tool in both roles.
//!
//! One `--guests linux,lego` boot (cx3-vfu, OpenSM): Linux puts
//! 192.168.100.1/24 on its `ib0`, ours 192.168.100.2/24. For each of
//! `ib_write_bw`, `ib_read_bw`, `ib_send_bw` (64 KiB x 200) and
//! `ib_write_lat`, `ib_read_lat` (8 B x 200), Linux's tool serves and ours
//! connects by IP address, then ours serves and Linux's connects. Every
//! result line on both sides names the same bytes and iterations (a
//! bandwidth server prints the client's figures, as perftest does; latency
//! servers print their own), and every Linux run exits 0. Then the same
//! five with `-R` (perftest's rdma_cm way), both ways, with the same
//! checks. Our client's `ib_send_lat` is refused with a
//! sentence, not run wrongly, and a `-R` client towards a port nobody
//! listens on says so.

use std::time::{Duration, Instant};

use tests::qemu;

const BW: &str = "-s 65536 -n 200";
const LAT: &str = "-s 8 -n 200";
const TOOLS: [(&str, &str); 5] = [
    ("ib_write_bw", BW),
    ("ib_read_bw", BW),
    ("ib_send_bw", BW),
    ("ib_write_lat", LAT),
    ("ib_read_lat", LAT),
];
/// The same five tools also run with `-R` (rdma_cm), both ways.
const RDMA_CM_TOOLS: [(&str, &str); 5] = TOOLS;

fn linux_script() -> String {
    let mut s = String::from(
        "wait-active 120; modprobe ib_ipoib; modprobe rdma_ucm; ip link set ib0 up; \
         ip addr add 192.168.100.1/24 dev ib0; retry 120 ping -c 1 -W 2 192.168.100.2",
    );
    for (t, o) in TOOLS {
        s += &format!(
            "; timeout 40 {t} {o}; retry 30 {t} {o} 192.168.100.2; echo linux-client-{t}-done"
        );
    }
    for (t, o) in RDMA_CM_TOOLS {
        s += &format!(
            "; timeout 40 {t} -R {o}; retry 30 {t} -R {o} 192.168.100.2; echo linux-client-{t}-R-done"
        );
    }
    s + "; wait-down 2 120"
}

fn our_script() -> String {
    let mut s = String::from(
        "retry -n 60 -i 1 ip addr add 192.168.100.2/24 dev ib0; \
         retry -n 180 -i 1 ping -c 1 -W 2 192.168.100.1; \
         ib_send_lat -n 5 192.168.100.1; ib_write_bw -R -n 5 -p 18600 192.168.100.1",
    );
    for (t, o) in TOOLS {
        s += &format!("; retry -n 30 -i 1 {t} {o} 192.168.100.1; {t} {o}");
    }
    // With -R as the client; as the server our tools take a -R client
    // as it comes.
    for (t, o) in RDMA_CM_TOOLS {
        s += &format!("; retry -n 30 -i 1 {t} -R {o} 192.168.100.1; {t} {o}");
    }
    s
}

#[test]
fn linux_and_our_perftest_meet_over_tcp_and_rdma_cm_both_ways() {
    let t = Instant::now();
    let (l_script, o_script) = (linux_script(), our_script());
    let r = qemu::run_vfu(
        &[
            "--guests",
            "linux,lego",
            "--run-on",
            "0",
            &l_script,
            "--run-on",
            "1",
            &o_script,
        ],
        Duration::from_secs(360),
        true,
    );
    let took = t.elapsed();
    let all = r.all();
    let (l, o) = (
        qemu::node(&r.transcript, 0).unwrap_or(""),
        qemu::node(&r.transcript, 1).unwrap_or(""),
    );
    // The guest's runner runs each command on its own and marks a failed
    // one with its status: none failed.
    for (t, _) in TOOLS {
        assert!(l.contains(&format!("linux-client-{t}-done")), "{all}");
    }
    for (t, _) in RDMA_CM_TOOLS {
        assert!(l.contains(&format!("linux-client-{t}-R-done")), "{all}");
    }
    let failed: Vec<&str> = l
        .lines()
        .filter(|x| x.starts_with("(exit status"))
        .collect();
    assert_eq!(failed.len(), 0, "{all}");
    // Bandwidth: three tools over TCP and the same three with -R, each
    // side prints one line as client and one as server; latency: write
    // latency on both sides in both roles, read latency on the client
    // only, each over TCP and with -R.
    assert_eq!(qemu::perftest_results(l, 65536, 200), 12, "{all}");
    assert_eq!(qemu::perftest_results(o, 65536, 200), 12, "{all}");
    assert_eq!(qemu::perftest_results(l, 8, 200), 6, "{all}");
    assert_eq!(qemu::perftest_results(o, 8, 200), 6, "{all}");
    // Both rdma_cm runs of each tool on our side said so in their header.
    assert_eq!(o.matches("rdma_cm QPs\t : ON").count(), 10, "{all}");
    assert!(
        o.contains("ib_send_lat against perftest's TCP exchange is not supported here"),
        "{all}"
    );
    // A -R client towards a port nobody listens on is told so at once
    // (Linux's CM answers the REQ with a REJ).
    assert!(
        o.contains("Couldn't connect to 192.168.100.1:18600 by rdma_cm")
            && o.contains("nobody listens there with -R"),
        "{all}"
    );
    for (who, text) in [("Linux", l), ("ours", o)] {
        for line in text.lines().filter(|x| {
            qemu::perftest_results(x, 65536, 200) + qemu::perftest_results(x, 8, 200) > 0
        }) {
            eprintln!("{who}: {line}");
        }
    }
    eprintln!("Linux and ours, five perftest tools both ways over TCP and with -R: {took:?}");
}
