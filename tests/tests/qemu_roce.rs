//! End-to-end Ethernet between two of our guests (`--nodes 2 --link-layer eth`): port 1 of each emulated ConnectX-3 on the fabric's Ethernet switch, mlx4_en's `eth0` with the address run-qemu.sh gives it, ARP and 20 pings with no loss, the counters `ethtool -S` reads from the rings and the port; and `--link-layer ib,eth`, IPoIB's `ib0` and mlx4_en's `eth0` on the two ports of one card at once.
//!
//! Two TCG boots, the first without a subnet manager (an Ethernet port
//! needs none), each about 15 s of its deadline on a loaded 2-core host.
//! The first prints its RTTs and the host's load average (docs/ethernet.md).

use std::time::Duration;

use tests::qemu;

/// The boot's deadline (TCG on a loaded 2-core machine).
const DEADLINE: Duration = Duration::from_secs(100);

const NODE_0: &str = "ip link show eth0; retry -n 60 -i 1 ping -c 1 -W 1 10.0.0.2; \
     ethtool -S eth0; ping -c 20 -i 0.05 10.0.0.2; ip neigh; ethtool -S eth0";
// Node 1 answers until node 0 has powered off (`retry -u`).
const NODE_1: &str = "retry -n 60 -i 1 ping -c 1 -W 1 10.0.0.1; \
     retry -n 90 -i 1 -u ping -c 1 -W 1 10.0.0.1";

/// The lines after `lego> {cmd}` up to the next prompt, log lines left out.
fn after<'a>(t: &'a str, cmd: &str) -> Vec<&'a str> {
    qemu::lines_after(t, "lego> ", cmd)
        .into_iter()
        .map(|l| l.trim_end_matches('\r'))
        .collect()
}

/// `ethtool -S`'s value of `name`.
fn counter(lines: &[&str], name: &str) -> Option<u64> {
    lines
        .iter()
        .find_map(|l| l.trim().strip_prefix(&format!("{name}: "))?.parse().ok())
}

#[test]
fn two_of_our_guests_ping_each_other_over_eth0() {
    let load = tests::load_average();
    let r = qemu::run_args(
        &[
            "--nodes",
            "2",
            "--link-layer",
            "eth",
            "--sm",
            "none",
            "--run-on",
            "0",
            NODE_0,
            "--run-on",
            "1",
            NODE_1,
        ],
        DEADLINE,
    );
    let all = r.all();
    assert_eq!(r.status, 0, "{all}");
    assert!(!r.stderr.contains("violation"), "{all}");
    let t0 = qemu::node(&r.transcript, 0).unwrap_or("");
    assert_eq!(
        after(t0, "ip link show eth0"),
        [
            "2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default",
            "    link/ether 00:02:c9:00:00:11 brd ff:ff:ff:ff:ff:ff",
        ],
        "{all}"
    );
    let ping = after(t0, "ping -c 20 -i 0.05 10.0.0.2");
    assert!(
        ping.iter()
            .any(|l| l.starts_with("20 packets transmitted, 20 received, 0% packet loss")),
        "{all}"
    );
    // ARP: node 1's MAC is its port GUID without the middle bytes.
    assert_eq!(
        after(t0, "ip neigh"),
        ["10.0.0.2 dev eth0 lladdr 00:02:c9:00:00:21 REACHABLE"],
        "{all}"
    );
    // The counters before the 20 pings and after them: a frame that came
    // while node 0's port was up but its receive steering not yet set
    // (node 1's first ARP broadcast, in a boot race) is a counted drop, as
    // on the card; during the pings nothing may be dropped.
    let first = after(t0, "ethtool -S eth0");
    let s = t0
        .rfind("lego> ethtool -S eth0")
        .map(|at| after(&t0[at..], "ethtool -S eth0"))
        .unwrap_or_default();
    let c = |n| counter(&s, n).unwrap_or_else(|| panic!("no {n} in {s:#?}"));
    let c0 = |n| counter(&first, n).unwrap_or_else(|| panic!("no {n} in {first:#?}"));
    assert!(c("rx0_packets") >= 21 && c("tx0_packets") >= 21, "{s:#?}");
    assert!(c("rx_packets_phy") >= c("rx0_packets"), "{s:#?}");
    assert_eq!(c("rx_errors"), 0, "{s:#?}");
    for n in [
        "rx_dropped",
        "tx_dropped",
        "rx_dropped_phy",
        "tx_dropped_phy",
    ] {
        assert_eq!(c(n), c0(n), "{n} grew during the pings: {first:#?}\n{s:#?}");
        if c0(n) > 0 {
            eprintln!("{n}: {} before the pings (boot race)", c0(n));
        }
    }
    let mut rtts: Vec<f64> = ping
        .iter()
        .filter_map(|l| l.split("time=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    rtts.sort_by(f64::total_cmp);
    eprintln!(
        "eth0 ping -c 20: median {:?} ms, {:?}; load average before: {load}, after: {}",
        rtts.get(rtts.len() / 2),
        ping.iter().find(|l| l.starts_with("rtt ")),
        tests::load_average()
    );
}

/// `--link-layer ib,eth`: port 1 on the InfiniBand switch (IPoIB's `ib0`,
/// 10.0.0.0/24, under the embedded SM), port 2 on the Ethernet switch
/// (mlx4_en's `eth0`, 10.0.1.0/24), both answering at once.
#[test]
fn ib0_and_eth0_side_by_side_on_one_card() {
    let r = qemu::run_args(
        &[
            "--nodes",
            "2",
            "--link-layer",
            "ib,eth",
            "--sm",
            "embedded",
            "--run-on",
            "0",
            "ip link show eth0; retry -n 90 -i 1 ping -c 1 -W 1 10.0.1.2; \
             retry -n 90 -i 1 ping -c 1 -W 1 10.0.0.2; \
             ping -c 10 -i 0.05 10.0.1.2; ping -c 10 -i 0.05 10.0.0.2",
            "--run-on",
            "1",
            "retry -n 90 -i 1 ping -c 1 -W 1 10.0.1.1; \
             retry -n 120 -i 1 -u ping -c 1 -W 1 10.0.1.1",
        ],
        DEADLINE,
    );
    let all = r.all();
    assert_eq!(r.status, 0, "{all}");
    assert!(!r.stderr.contains("violation"), "{all}");
    let t0 = qemu::node(&r.transcript, 0).unwrap_or("");
    // Port 2's MAC: node 0's port GUID 00:02:c9:03:00:00:00:12 without the
    // middle bytes.
    assert_eq!(
        after(t0, "ip link show eth0").get(1).copied(),
        Some("    link/ether 00:02:c9:00:00:12 brd ff:ff:ff:ff:ff:ff"),
        "{all}"
    );
    for peer in ["10.0.1.2", "10.0.0.2"] {
        let ping = after(t0, &format!("ping -c 10 -i 0.05 {peer}"));
        assert!(
            ping.iter()
                .any(|l| l.starts_with("10 packets transmitted, 10 received, 0% packet loss")),
            "{peer}: {all}"
        );
    }
}
