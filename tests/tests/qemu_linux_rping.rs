//! rping between an unmodified Linux 6.1 guest (rdma-core 44's `rping`, its own `rdma_cm` and `ib_ipoib`) and ours, by IP address over IPoIB, in both roles, `-C 100 -V`.
//!
//! One `--guests linux,lego` boot (cx3-vfu, OpenSM): Linux puts
//! 192.168.100.1/24 on its `ib0`, ours 192.168.100.2/24. First Linux
//! serves (`rping -s -a 192.168.100.1 -v`) and our client pings 100 times
//! with the data checked; then ours serves (`rping -s -v`) and Linux's
//! client does the same. Both sides print rping's lines. The Linux
//! guest's runner runs each `;` command in a shell of its own (so `$?`
//! names nothing across them) and prints `(exit status N)` after each that
//! failed: the test counts those.

use std::time::{Duration, Instant};

use tests::qemu;

const LINUX: &str = "wait-active 120; modprobe ib_ipoib; modprobe rdma_ucm; ip link set ib0 up; \
     ip addr add 192.168.100.1/24 dev ib0; retry 120 ping -c 1 -W 2 192.168.100.2; \
     timeout 90 rping -s -a 192.168.100.1 -v; echo linux-server-done; \
     retry 60 rping -c -a 192.168.100.2 -C 100 -v -V; echo linux-client-done; wait-down 2 120";
const OURS: &str = "retry -n 60 -i 1 ip addr add 192.168.100.2/24 dev ib0; \
     retry -n 180 -i 1 ping -c 1 -W 2 192.168.100.1; \
     retry -n 60 -i 1 rping -c -a 192.168.100.1 -C 100 -v -V; rping -s -v";

#[test]
fn linux_and_our_guest_rping_each_other_both_ways() {
    let t = Instant::now();
    let r = qemu::run_vfu(
        &[
            "--guests",
            "linux,lego",
            "--run-on",
            "0",
            LINUX,
            "--run-on",
            "1",
            OURS,
        ],
        Duration::from_secs(240),
        true,
    );
    let took = t.elapsed();
    let all = r.all();
    let (l, o) = (
        qemu::node(&r.transcript, 0).unwrap_or(""),
        qemu::node(&r.transcript, 1).unwrap_or(""),
    );
    // Linux serves, ours pings.
    let ours_pings = o
        .lines()
        .filter(|x| x.starts_with("ping data: rdma-ping-"))
        .count();
    assert_eq!(ours_pings, 100, "{all}");
    let linux_served = l
        .lines()
        .filter(|x| x.contains("server ping data: rdma-ping-"))
        .count();
    assert_eq!(linux_served, 100, "{all}");
    // The Linux server's command, the first rping there, exited 0.
    let (first, rest) = l
        .split_once("linux-server-done")
        .unwrap_or_else(|| panic!("the Linux server never ended\n{all}"));
    let server_part = first
        .rsplit_once("# timeout 90 rping -s")
        .unwrap_or_else(|| panic!("the Linux server never started\n{all}"))
        .1;
    assert!(!server_part.contains("(exit status"), "{all}");
    // Ours serves, Linux pings.
    let linux_pings = l
        .lines()
        .filter(|x| x.trim_start().starts_with("ping data: rdma-ping-"))
        .count();
    assert_eq!(linux_pings, 100, "{all}");
    // And the client's (retry ends with the status of its last try).
    let client_part = rest
        .split_once("linux-client-done")
        .map(|x| x.0)
        .unwrap_or_else(|| panic!("the Linux client never ended\n{all}"));
    assert!(!client_part.contains("(exit status"), "{all}");
    // No command of the Linux guest failed.
    assert_eq!(l.matches("(exit status").count(), 0, "{all}");
    let ours_served = o
        .lines()
        .filter(|x| x.starts_with("server ping data: rdma-ping-"))
        .count();
    assert_eq!(ours_served, 100, "{all}");
    assert!(
        !l.contains("data mismatch") && !o.contains("data mismatch"),
        "{all}"
    );
    assert_eq!(r.status, 0, "{all}");
    eprintln!("Linux and ours, rping -C 100 -V both ways: {took:?}");
}
