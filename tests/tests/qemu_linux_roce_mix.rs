//! An unmodified Linux 6.1 guest (its own mlx4_core, mlx4_en, mlx4_ib, rdma-core 44's `rping`) and one of ours on the model's Ethernet ports: ping both ways over mlx4_en and ours, Linux's `ibv_devinfo` showing its RoCE port, then Linux's real `rping` against ours over RoCE (the RDMA CM, ARP, IPv4-mapped GIDs) in both roles, `-C 20 -V`, and Linux's perftest 4.5-0.17 against ours over RoCE (`ib_write_bw` 64 KiB and `ib_write_lat` 8 B, 200 each, perftest's TCP exchange with the GID message) in both roles; then a VLAN device over each side's eth0 (`ip link add link eth0 name eth0.5 type vlan id 5`), ping and `rping -C 10 -V` over it both ways, the capture showing the VLAN's RoCE frames tagged 5; no model violation.
//!
//! One `--guests linux,lego` boot (cx3-vfu, so both guests reach the model
//! over vfio-user; `--link-layer eth --port-type eth`: port 1 of each card on
//! the fabric's learning Ethernet switch, no subnet manager). Linux has no
//! e1000 here (only one Linux guest), so mlx4_en's interface is its `eth0`,
//! 192.168.50.1/24; ours is our mlx4_en's `eth0`, 192.168.50.2/24. Each
//! pings the other 20 times; Linux waits (its ICMP counters) until our 20
//! echo requests have arrived. Then Linux serves `rping -s` and our client
//! pings 20 times with the data checked, then ours serves and Linux's
//! client does the same. Then the same for `ib_write_bw -s 65536 -n 200`
//! and `ib_write_lat -s 8 -n 200`: Linux's tool with `-x 1` (its
//! IPv4-mapped RoCE v1 GID), ours choosing its IPv4-mapped GID by itself;
//! each side prints the other's GID, and result lines with the same bytes
//! and iterations. Then each side makes `eth0.5` (VLAN 5, Linux
//! 192.168.55.1, ours 192.168.55.2), pings the other 10 times over it, and
//! rping runs over it in both roles (`-C 10 -V`): Linux's 8021q and
//! mlx4_en (hardware tag insertion and stripping, its mlx4_ib's VLAN path
//! in the QP context) against ours. tshark must find RoCE v1 frames in
//! VLAN 5 from both ends, and ICMP in it. Every Linux command must exit 0
//! (its runner's `(exit status N)` lines). Ours answers pings until Linux
//! has powered off.

use std::time::{Duration, Instant};

use tests::qemu;

/// The deadline of the whole run (run-qemu.sh's --timeout, per guest).
const DEADLINE: Duration = Duration::from_secs(230);

const LINUX_PING: &str = "ping -c 20 -i 0.2 192.168.50.2";
const OURS_PING: &str = "ping -c 20 -i 0.2 192.168.50.1";

/// Linux: mlx4_en's eth0 up with 192.168.50.1, the RoCE port as verbs see
/// it, 20 pings to ours, then (at most 60 s) until 21 echo requests (ours'
/// first ping and its 20) have arrived.
const LINUX: &str = "modprobe mlx4_en; ip link set eth0 up; ip addr add 192.168.50.1/24 dev eth0; \
     for i in $(seq 30); do grep -q up /sys/class/net/eth0/operstate && break; sleep 1; done; \
     cat /sys/class/net/eth0/operstate; ibv_devinfo -d mlx4_0 -i 1; \
     retry 60 ping -c 1 -W 2 192.168.50.2; ping -c 20 -i 0.2 192.168.50.2; \
     for i in $(seq 60); do set -- $(grep ^Icmp: /proc/net/snmp | tail -1); [ ${10} -ge 21 ] && break; sleep 1; done; \
     grep ^Icmp: /proc/net/snmp; modprobe rdma_ucm; \
     timeout 90 rping -s -a 192.168.50.1 -C 20 -v -V; \
     retry 60 rping -c -a 192.168.50.2 -C 20 -v -V; \
     cat /sys/class/infiniband/mlx4_0/ports/1/gids/1 /sys/class/infiniband/mlx4_0/ports/1/gid_attrs/types/1; \
     timeout 40 ib_write_bw -x 1 -s 65536 -n 200; \
     retry 30 ib_write_bw -x 1 -s 65536 -n 200 192.168.50.2; echo linux-client-ib_write_bw-done; \
     timeout 40 ib_write_lat -x 1 -s 8 -n 200; \
     retry 30 ib_write_lat -x 1 -s 8 -n 200 192.168.50.2; echo linux-client-ib_write_lat-done; \
     modprobe 8021q; ip link add link eth0 name eth0.5 type vlan id 5; ip link set eth0.5 up; \
     ip addr add 192.168.55.1/24 dev eth0.5; \
     retry 60 ping -c 1 -W 2 192.168.55.2; ping -c 10 -i 0.2 192.168.55.2; \
     timeout 60 rping -s -a 192.168.55.1 -C 10 -v -V; \
     retry 60 rping -c -a 192.168.55.2 -C 10 -v -V; echo linux-vlan-done";

/// Ours: the address on our mlx4_en's eth0, 20 pings to Linux, then
/// answering until Linux has powered off (`retry -u`).
const OURS: &str = "retry -n 60 -i 1 ip addr add 192.168.50.2/24 dev eth0; \
     retry -n 120 -i 1 ping -c 1 -W 2 192.168.50.1; ping -c 20 -i 0.2 192.168.50.1; \
     retry -n 60 -i 1 rping -c -a 192.168.50.1 -C 20 -v -V; \
     rping -s -a 192.168.50.2 -C 20 -v -V; \
     retry -n 30 -i 1 ib_write_bw -s 65536 -n 200 192.168.50.1; ib_write_bw -s 65536 -n 200; \
     retry -n 30 -i 1 ib_write_lat -s 8 -n 200 192.168.50.1; ib_write_lat -s 8 -n 200; \
     ip link add link eth0 name eth0.5 type vlan id 5; ip addr add 192.168.55.2/24 dev eth0.5; \
     retry -n 120 -i 1 ping -c 1 -W 2 192.168.55.1; ping -c 10 -i 0.2 192.168.55.1; \
     retry -n 60 -i 1 rping -c -a 192.168.55.1 -C 10 -v -V; \
     rping -s -a 192.168.55.2 -C 10 -v -V; show_gids; ip -d -s link show eth0.5; \
     retry -n 120 -i 1 -u ping -c 1 -W 1 192.168.55.1";

#[test]
fn linux_and_our_guest_ping_rping_and_perftest_each_other_over_the_models_ethernet_ports() {
    let load_before = tests::load_average();
    let cap = tests::target_tmpdir().join(format!("qemu-roce-mix-{}.pcapng", std::process::id()));
    let emu_args = format!(
        "--link-layer eth --port-type eth --stats --capture {}",
        cap.display()
    );
    let t = Instant::now();
    let r = qemu::run_vfu(
        &[
            "--guests",
            "linux,lego",
            "--sm",
            "none",
            "--emu-args",
            &emu_args,
            "--run-on",
            "0",
            LINUX,
            "--run-on",
            "1",
            OURS,
        ],
        DEADLINE,
        true,
    );
    let took = t.elapsed();
    let all = r.all();
    let (l, o) = r.two_clean_nodes();
    assert!(
        !l.contains("(exit status") && l.contains("run: 0 of "),
        "a Linux command failed:\n{all}"
    );
    assert_eq!(
        qemu::lines_after(l, "# ", "cat /sys/class/net/eth0/operstate").first(),
        Some(&"up"),
        "Linux's eth0:\n{all}"
    );
    // Linux's verbs see its own port on the model as RoCE: Active, link
    // layer Ethernet.
    let info = qemu::lines_after(l, "# ", "ibv_devinfo -d mlx4_0 -i 1");
    for want in ["state: PORT_ACTIVE (4)", "link_layer: Ethernet"] {
        assert!(
            qemu::has_words(&info, want),
            "ibv_devinfo has no '{want}':\n{all}"
        );
    }
    // Both ways, none lost.
    let lp = qemu::lines_after(l, "# ", LINUX_PING);
    assert!(
        lp.contains(&"20 packets transmitted, 20 packets received, 0% packet loss"),
        "Linux's ping:\n{all}"
    );
    let op = qemu::lines_after(o, "lego> ", OURS_PING);
    assert!(
        op.iter()
            .any(|x| x.starts_with("20 packets transmitted, 20 received, 0% packet loss")),
        "our ping:\n{all}"
    );
    // /proc/net/snmp's ICMP rows: the names, then the values (InEchos is
    // the ninth).
    let icmp = qemu::lines_after(l, "# ", "grep ^Icmp: /proc/net/snmp");
    let echos: u64 = icmp
        .get(1)
        .and_then(|x| x.split_whitespace().nth(9))
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    assert!(echos >= 21, "Linux answered {echos} echo requests:\n{all}");
    // rping over RoCE: Linux serves, ours pings; ours serves, Linux pings.
    // Each side's -v lines, 20 each way, and both of Linux's exits 0 (no
    // `(exit status` line above).
    let count = |t: &str, what: &str| {
        t.lines()
            .filter(|x| x.trim_start().starts_with(what))
            .count()
    };
    let linux_server =
        qemu::lines_after(l, "# ", "timeout 90 rping -s -a 192.168.50.1 -C 20 -v -V");
    let linux_client = qemu::lines_after(l, "# ", "retry 60 rping -c -a 192.168.50.2 -C 20 -v -V");
    let ours_client = qemu::lines_after(o, "lego> ", "retry -n 60 -i 1 rping -c -a 192.168.50.1");
    let ours_server = qemu::lines_after(o, "lego> ", "rping -s -a 192.168.50.2");
    let srv = "server ping data: rdma-ping-";
    let cli = "ping data: rdma-ping-";
    for (lines, what, who) in [
        (&linux_server, srv, "Linux's rping server"),
        (&linux_client, cli, "Linux's rping client"),
        (&ours_client, cli, "our rping client"),
        (&ours_server, srv, "our rping server"),
    ] {
        assert_eq!(count(&lines.join("\n"), what), 20, "{who}:\n{all}");
    }
    // No data mismatch, no server failure; a client attempt of ours that
    // found no server listening yet is retried (`retry: rping failed`).
    for t in [l, o] {
        assert!(
            !t.contains("data mismatch") && !t.contains("rping server failed"),
            "{all}"
        );
    }
    assert!(!l.contains("rping client failed"), "{all}");
    assert_eq!(
        o.matches("rping client failed").count(),
        o.matches("retry: rping failed").count(),
        "an rping client of ours failed without a retry:\n{all}"
    );
    // perftest over RoCE through its TCP exchange on the Ethernet
    // interfaces: Linux's index 1 is its IPv4-mapped RoCE v1 GID, which
    // `-x 1` names; ours picks its IPv4-mapped GID as perftest's
    // get_best_gid_index does. Each side printed the other's GID from the
    // GID-form message, and each run's result line (a bandwidth server
    // prints the client's figures) names the same bytes and iterations.
    assert_eq!(
        qemu::lines_after(
            l,
            "# ",
            "cat /sys/class/infiniband/mlx4_0/ports/1/gids/1 /sys/class/infiniband/mlx4_0/ports/1/gid_attrs/types/1"
        ),
        ["0000:0000:0000:0000:0000:ffff:c0a8:3201", "IB/RoCE v1"],
        "Linux's GID 1:\n{all}"
    );
    for t in ["ib_write_bw", "ib_write_lat"] {
        assert!(l.contains(&format!("linux-client-{t}-done")), "{all}");
    }
    let gid_line =
        |last: u8| format!(" GID: 00:00:00:00:00:00:00:00:00:00:255:255:192:168:50:{last:02}");
    assert!(
        l.matches(&gid_line(2)).count() >= 4,
        "Linux's perftest did not print our GID four times (remote, two tools, two roles):\n{all}"
    );
    assert!(
        o.matches(&gid_line(1)).count() >= 4,
        "our perftest did not print Linux's GID four times:\n{all}"
    );
    assert!(o.matches("GID index       : 1").count() >= 4, "{all}");
    for (who, text) in [("Linux", l), ("ours", o)] {
        assert_eq!(
            qemu::perftest_results(text, 65536, 200),
            2,
            "{who}'s ib_write_bw lines:\n{all}"
        );
        assert_eq!(
            qemu::perftest_results(text, 8, 200),
            2,
            "{who}'s ib_write_lat lines:\n{all}"
        );
    }
    // The VLAN: pings both ways, rping in both roles, Linux done.
    assert!(l.contains("linux-vlan-done"), "{all}");
    let lvp = qemu::lines_after(l, "# ", "ping -c 10 -i 0.2 192.168.55.2");
    assert!(
        lvp.contains(&"10 packets transmitted, 10 packets received, 0% packet loss"),
        "Linux's ping over eth0.5:\n{all}"
    );
    let ovp = qemu::lines_after(o, "lego> ", "ping -c 10 -i 0.2 192.168.55.1");
    assert!(
        ovp.iter()
            .any(|x| x.starts_with("10 packets transmitted, 10 received, 0% packet loss")),
        "our ping over eth0.5:\n{all}"
    );
    for (lines, what, who) in [
        (
            qemu::lines_after(l, "# ", "timeout 60 rping -s -a 192.168.55.1 -C 10 -v -V"),
            srv,
            "Linux's rping server on eth0.5",
        ),
        (
            qemu::lines_after(l, "# ", "retry 60 rping -c -a 192.168.55.2 -C 10 -v -V"),
            cli,
            "Linux's rping client on eth0.5",
        ),
        (
            qemu::lines_after(o, "lego> ", "retry -n 60 -i 1 rping -c -a 192.168.55.1"),
            cli,
            "our rping client on eth0.5",
        ),
        (
            qemu::lines_after(o, "lego> ", "rping -s -a 192.168.55.2"),
            srv,
            "our rping server on eth0.5",
        ),
    ] {
        assert_eq!(count(&lines.join("\n"), what), 10, "{who}:\n{all}");
    }
    // Our show_gids names the VLAN's GIDs by eth0.5; ip -d shows the VLAN.
    let gids = qemu::lines_after(o, "lego> ", "show_gids");
    assert!(
        gids.iter()
            .any(|x| x.contains("192.168.55.2") && x.trim_end().ends_with("eth0.5")),
        "show_gids:\n{all}"
    );
    assert!(
        o.contains("eth0.5@eth0:") && o.contains("vlan protocol 802.1Q id 5"),
        "{all}"
    );
    // tshark: RoCE v1 in VLAN 5 both ways (rping's CM MADs and RDMA), ICMP
    // in it; no malformed frame (the heuristic dissectors that take
    // InfiniBand payloads for RPC-over-RDMA or an Ethertype switched off,
    // as in qemu_linux_roce).
    if std::path::Path::new("/usr/bin/tshark").exists() {
        let tshark = |filter: &str, field: &str| -> Vec<String> {
            let out = std::process::Command::new("/usr/bin/tshark")
                .args(["-n", "-r"])
                .arg(&cap)
                .args(["--disable-protocol", "rpcordma"])
                .args(["--disable-heuristic", "eth_over_ib"])
                .args(["-Y", filter, "-T", "fields", "-e", field])
                .output()
                .expect("tshark runs");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        };
        let roce5 = tshark("vlan.id == 5 && vlan.etype == 0x8915", "eth.src");
        let senders: std::collections::BTreeSet<&String> = roce5.iter().collect();
        assert!(
            roce5.len() >= 40 && senders.len() == 2,
            "{} RoCE frames in VLAN 5 from {senders:?}",
            roce5.len()
        );
        let icmp5 = tshark("vlan.id == 5 && icmp", "icmp.type");
        assert!(icmp5.len() >= 40, "{} ICMP frames in VLAN 5", icmp5.len());
        assert!(tshark("_ws.malformed", "frame.number").is_empty());
        eprintln!(
            "VLAN 5 on the wire: {} RoCE v1 frames, {} ICMP",
            roce5.len(),
            icmp5.len()
        );
    } else {
        eprintln!("!!!!! tshark missing: the capture was not dissected");
    }
    let _ = std::fs::remove_file(&cap);
    for (who, text) in [("Linux", l), ("ours", o)] {
        for line in text.lines().filter(|x| {
            qemu::perftest_results(x, 65536, 200) + qemu::perftest_results(x, 8, 200) > 0
        }) {
            eprintln!("{who}: {line}");
        }
    }
    eprintln!(
        "Linux <-> ours over Ethernet on the model: Linux's ping rtt {:?}; ours {:?}; \
         run {took:?}; load average {load_before} before, {} after",
        lp.iter().find(|x| x.starts_with("round-trip ")),
        op.iter().find(|x| x.starts_with("rtt ")),
        tests::load_average()
    );
}
