//! VLAN devices over mlx4_en and RoCE over them, between driver-run HCAs on the fabric's Ethernet switch: `ip link add link eth0 name eth0.5 type vlan id 5`, ping over the VLAN, the VLAN's GIDs in mlx4_ib's table, `rping -C 10 -V` through the RDMA CM from the VLAN's address, the capture showing every frame of it tagged, and a deleted VLAN device whose VID the card then refuses.
//!
//! Two model HCAs with Ethernet ports (`--nodes 2 --link-layer eth`), each
//! with the real mlx4_core + mlx4_ib + ib_core and mlx4_en's `eth0`
//! (10.0.0.1/24, 10.0.0.2/24) plus the VLAN device `eth0.5` (10.5.0.1/24,
//! 10.5.0.2/24) in one IP stack, glued as the kernel glues them
//! (`kernel/src/net.rs` `roce_sync`: after every pass of the stack mlx4_ib
//! hears each Ethernet link's VLAN, addresses and neighbours).

use ib_core::verbs::{Gid, PortState};
use mlx4_ib::roce::{NO_VLAN, iboe_mac_vlan_to_ll, ipv4_gid};
use net::LinkId;
use sim::fabric::capture::Capture;
use tests::eth_node::{EthNode as Node, now_us, rping_pair, run, two_nodes};

/// `ip ARGS` on `n`'s stack, with the guest as its links' context.
fn ip(n: &mut Node, args: &str) -> Result<String, String> {
    let words: Vec<&str> = args.split_whitespace().collect();
    let mut out = String::new();
    net::iproute::ip(&mut n.stack, Some(&mut n.g.core), &words, &mut out).map(|()| out)
}

fn link(n: &Node, name: &str) -> LinkId {
    n.stack.link_id(name).expect(name)
}

/// The GIDs in use on port 1 (ib_core's cache), in table order.
fn gids(n: &Node) -> Vec<Gid> {
    let c =
        n.g.core
            .device(n.g.dev)
            .and_then(|d| d.port_cache(1).ok())
            .expect("port 1");
    (0..8)
        .filter_map(|i| c.get_gid(i).ok())
        .filter(|g| g.0 != [0; 16])
        .collect()
}

/// `ping -c COUNT -i 0.2 -W 1 TO` from `n[from]`: the replies.
fn pings(n: &mut [&mut Node; 2], from: usize, to: &str, count: u16) -> u64 {
    let c = count.to_string();
    let o = net::ping::parse(&["-c", &c, "-i", "0.2", "-W", "1", to]).unwrap();
    let mut out = String::new();
    let now = now_us(&n[from].g.core);
    let mut p = net::ping::Ping::start(&mut n[from].stack, o, now, &mut out).unwrap();
    run(n, |n| {
        let now = now_us(&n[from].g.core);
        !p.step(&mut n[from].stack, now, &mut out)
    });
    let got = p.received_count();
    p.finish(&mut n[from].stack, &mut out);
    eprintln!("{out}");
    got
}

/// Two nodes on `--nodes 2 --link-layer eth`: eth0 at 10.0.0.1 and .2, and
/// on each `eth0.5` made as a user makes it, at 10.5.0.1 and .2.
fn pair() -> (
    std::sync::Arc<std::sync::Mutex<sim::fabric::Fabric>>,
    Node,
    Node,
) {
    let (f, mut a, mut b) = two_nodes(["10.0.0.1", "10.0.0.2"]);
    for (n, v) in [(&mut a, "10.5.0.1"), (&mut b, "10.5.0.2")] {
        ip(n, "link add link eth0 name eth0.5 type vlan id 5").expect("ip link add");
        ip(n, &format!("addr add {v}/24 dev eth0.5")).expect("ip addr add");
    }
    (f, a, b)
}

/// tshark's count of the frames of `pcap` that `filter` matches; `None`
/// without tshark.
fn tshark_count(pcap: &std::path::Path, filter: &str) -> Option<usize> {
    let out = std::process::Command::new("tshark")
        .args(["-n", "-r"])
        .arg(pcap)
        .args(["-Y", filter])
        .output()
        .ok()?;
    assert!(out.status.success(), "tshark -Y {filter}: {out:?}");
    Some(String::from_utf8_lossy(&out.stdout).lines().count())
}

#[test]
fn a_vlan_device_carries_ip_and_roce_tagged_and_its_deletion_gives_the_vid_back() {
    let (fabric, mut a, mut b) = pair();
    let mut n = [&mut a, &mut b];
    let (va, vb) = (link(n[0], "eth0.5"), link(n[1], "eth0.5"));
    let up = run(&mut n, |n| {
        n.iter().all(|x| {
            x.stack.carrier(x.eth0)
                && x.stack.carrier(link(x, "eth0.5"))
                && x.g
                    .core
                    .device(x.g.dev)
                    .and_then(|d| d.port_cache(1).ok())
                    .is_some_and(|c| c.state == Some(PortState::Active))
                && gids(x).len() >= 4
        })
    });
    assert!(up, "eth0 and eth0.5 up on both, four GIDs");

    // ip link as iproute2 shows a VLAN device.
    let l = ip(n[0], "-d link show eth0.5").unwrap();
    assert!(
        l.contains(": eth0.5@eth0: <BROADCAST,MULTICAST,UP,LOWER_UP>"),
        "{l}"
    );
    assert!(l.contains("vlan protocol 802.1Q id 5 <REORDER_HDR>"), "{l}");
    // Its mistakes, in iproute2's words.
    for (cmd, says) in [
        (
            "link add link eth0 name eth0.55 type vlan id 5",
            "File exists",
        ),
        (
            "link add link eth0 name x type vlan id 4095",
            "Invalid VLAN id",
        ),
        (
            "link add link eth0 name x type vlan id 70000",
            "id is invalid",
        ),
        (
            "link add link eth0 name x type bridge",
            "Unknown device type",
        ),
        ("link add link eth0 name x type vlan", "VLAN id is required"),
        ("link delete eth0", "Operation not supported"),
        (
            "link add link eth9 name x type vlan id 6",
            "Cannot find device",
        ),
    ] {
        let e = ip(n[0], cmd).expect_err(cmd);
        assert!(e.contains(says), "ip {cmd}: {e}");
    }

    // The GID table: the port's link-local and IPv4 GIDs, then the VLAN's
    // (its link-local GID names VLAN 5), each entry with its VLAN.
    let mac = n[0].mlx4_ib().roce_port(1).unwrap().mac;
    let g = gids(n[0]);
    assert_eq!(g[0].0, iboe_mac_vlan_to_ll(&mac, None));
    assert_eq!(g[1].0, ipv4_gid([10, 0, 0, 1]));
    assert_eq!(g[2].0, iboe_mac_vlan_to_ll(&mac, Some(5)));
    assert_eq!(g[3].0, ipv4_gid([10, 5, 0, 1]));
    let rp = n[0].mlx4_ib().roce_port(1).unwrap().clone();
    assert_eq!(rp.gid_vlans[..4], [NO_VLAN, NO_VLAN, 5, 5]);
    assert!(rp.vlan_index(5).is_some());

    // Capture what crosses the cables from here on.
    let pcap = std::env::temp_dir().join(format!("mlx4_roce_vlan-{}.pcapng", std::process::id()));
    fabric
        .lock()
        .unwrap()
        .set_capture(Some(Capture::create(&pcap).expect("capture file")));

    // Ping over the VLAN, then over the port itself.
    assert_eq!(pings(&mut n, 0, "10.5.0.2", 3), 3, "pings over eth0.5");
    assert_eq!(pings(&mut n, 0, "10.0.0.2", 2), 2, "pings over eth0");
    let sb = n[1].stack.stats(vb).unwrap();
    assert!(
        sb.rx_packets >= 3 && sb.tx_packets >= 3,
        "eth0.5 of B counted {sb:?}"
    );
    let sa = n[0].stack.stats(va).unwrap();
    assert!(
        sa.rx_packets >= 3 && sa.tx_packets >= 3,
        "eth0.5 of A counted {sa:?}"
    );

    // rping through the RDMA CM from the VLAN's address: the route is the
    // VLAN device's, the QPs' paths carry its VLAN.
    let (_sout, cout) = rping_pair(
        &mut n,
        &["-s", "-a", "10.5.0.2", "-v"],
        &["-c", "-a", "10.5.0.2", "-C", "10", "-v", "-V"],
    );
    assert_eq!(
        cout.lines()
            .filter(|l| l.starts_with("ping data: rdma-ping-"))
            .count(),
        10,
        "{cout}"
    );
    assert!(!cout.contains("data mismatch"), "{cout}");

    // B deletes its VLAN device: the VID leaves its card's VLAN table, and
    // A's tagged pings are the card's counted drops.
    ip(n[1], "link delete eth0.5").expect("ip link delete");
    assert!(n[1].stack.link_id("eth0.5").is_none());
    assert!(
        run(&mut n, |n| gids(n[1]).len() == 2),
        "B's VLAN GIDs gone: {:?}",
        gids(n[1])
    );
    assert_eq!(n[1].mlx4_ib().roce_port(1).unwrap().vlan_index(5), None);
    let before = n[1].ethtool("rx_dropped_phy");
    assert_eq!(
        pings(&mut n, 0, "10.5.0.2", 2),
        0,
        "no answer once B has no VLAN 5"
    );
    let dropped = n[1].ethtool("rx_dropped_phy") - before;
    assert!(dropped >= 2, "B's card dropped {dropped} tagged frames");
    // The port itself still works.
    assert_eq!(pings(&mut n, 0, "10.0.0.2", 1), 1, "pings over eth0");

    let cap = fabric.lock().unwrap().set_capture(None);
    drop(cap);
    // Every RoCE frame of the rping was tagged 5; ARP and ICMP crossed in
    // VLAN 5 and untagged.
    match (
        tshark_count(&pcap, "vlan.id == 5 && vlan.etype == 0x8915"),
        tshark_count(&pcap, "!vlan && eth.type == 0x8915"),
        tshark_count(&pcap, "vlan.id == 5 && icmp"),
        tshark_count(&pcap, "!vlan && icmp"),
    ) {
        (Some(roce5), Some(roce0), Some(icmp5), Some(icmp0)) => {
            assert!(roce5 >= 40, "{roce5} RoCE frames in VLAN 5");
            assert_eq!(roce0, 0, "untagged RoCE frames");
            assert!(icmp5 >= 6, "{icmp5} ICMP frames in VLAN 5");
            assert!(icmp0 >= 4, "{icmp0} untagged ICMP frames");
        }
        _ => eprintln!("!!!!! tshark missing: the capture was not dissected"),
    }
    let _ = std::fs::remove_file(&pcap);
    a.finish();
    b.finish();
}
