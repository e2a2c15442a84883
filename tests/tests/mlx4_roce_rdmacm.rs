//! The RDMA CM over RoCE v1 between driver-run HCAs on the fabric's Ethernet switch: address resolution by Ethernet ARP on mlx4_en's link, the route made locally from the IPv4-mapped GIDs, the REQ over QP1 on RoCE, and our `rping -C 10 -V` end to end.
//!
//! Two model HCAs whose port 1 is an Ethernet port on the model's learning
//! Ethernet switch (`--nodes 2 --link-layer eth`), each with the real
//! mlx4_core + mlx4_ib + ib_core and mlx4_en's `eth0` in an IP stack
//! (10.0.0.1/24, 10.0.0.2/24), glued as the kernel glues them
//! (`kernel/src/net.rs`): the link names its RoCE port, and after every
//! pass of the stack mlx4_ib hears the link's addresses (the GID table)
//! and neighbours (destination MACs).

use std::task::Poll;
use std::time::Instant;

use ib_core::verbs::{Gid, PortState};
use mlx4_ib::Mlx4IbDev;
use tests::eth_node::{EthNode as Node, LIMIT, rping_pair, run, two_nodes};

/// Entry `i` of port 1's GID table (ib_core's cache).
fn gid(n: &Node, i: usize) -> Option<Gid> {
    n.g.core
        .device(n.g.dev)?
        .port_cache(1)
        .ok()?
        .get_gid(i)
        .ok()
}

/// A and B at 10.0.0.1 and 10.0.0.2.
fn pair() -> (
    std::sync::Arc<std::sync::Mutex<sim::fabric::Fabric>>,
    Node,
    Node,
) {
    two_nodes(["10.0.0.1", "10.0.0.2"])
}

#[test]
fn our_rping_over_roce_through_the_rdma_cm() {
    let (_fabric, mut a, mut b) = pair();
    let mut n = [&mut a, &mut b];
    let up = run(&mut n, |n| {
        n.iter().all(|x| {
            x.stack.carrier(x.eth0)
                && x.g
                    .core
                    .device(x.g.dev)
                    .and_then(|d| d.port_cache(1).ok())
                    .is_some_and(|c| c.state == Some(PortState::Active))
                && gid(x, 1).is_some_and(|g| g.0[10..12] == [0xff, 0xff])
        })
    });
    assert!(up, "both eth0 up, ports Active, IPv4 GIDs written");
    // The GID table has the interface's address (rdma_ip2gid).
    assert_eq!(gid(n[1], 1), Some(Gid::new(0, 0xffff_0a00_0002)));

    // `rping -s -a 10.0.0.2 -v` against `rping -c -a 10.0.0.2 -C 10 -v -V`.
    let t = Instant::now();
    let (sout, cout) = rping_pair(
        &mut n,
        &["-s", "-a", "10.0.0.2", "-v"],
        &["-c", "-a", "10.0.0.2", "-C", "10", "-v", "-V"],
    );
    let took = t.elapsed();
    let pings: Vec<&str> = cout
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .collect();
    assert_eq!(pings.len(), 10, "{cout}");
    assert_eq!(
        sout.lines()
            .filter(|l| l.starts_with("server ping data: rdma-ping-"))
            .count(),
        10,
        "{sout}"
    );
    assert!(!cout.contains("data mismatch"), "{cout}");
    // The client found B's MAC by Ethernet ARP, and mlx4_ib took it as the
    // destination MAC of B's IPv4-mapped GID.
    let b_mac = n[1]
        .g
        .core
        .device_mut(n[1].g.dev)
        .and_then(|d| d.provider_as::<Mlx4IbDev>())
        .and_then(|m| m.roce_port(1).map(|r| r.mac))
        .unwrap();
    let dev = n[0].g.dev;
    let neigh = n[0]
        .g
        .core
        .device_mut(dev)
        .and_then(|d| d.provider_as::<Mlx4IbDev>())
        .and_then(|m| m.roce_port(1).map(|r| r.neigh.clone()))
        .unwrap();
    assert!(neigh.contains(&([10, 0, 0, 2], b_mac)), "{neigh:?}");
    eprintln!("rping -C 10 -V over RoCE: {took:?} on the model");
    a.finish();
    b.finish();
}

/// Broadcast frames port 1 of `n`'s card has received (`ethtool -S`).
fn rx_broadcast(n: &mut Node) -> u64 {
    n.ethtool("rx_broadcast_phy")
}

#[test]
fn an_address_nobody_answers_for_is_asked_again_each_second_then_an_addr_error() {
    let (_fabric, mut a, mut b) = pair();
    let mut n = [&mut a, &mut b];
    assert!(
        run(&mut n, |n| n.iter().all(
            |x| x.stack.carrier(x.eth0) && gid(x, 1).is_some_and(|g| g.0[10..12] == [0xff, 0xff])
        )),
        "both eth0 up"
    );
    let before = rx_broadcast(n[1]);
    // 10.0.0.9 is on the network but nobody has it: rping's 2 s resolution
    // ends in ADDR_ERROR -ETIMEDOUT, said plainly, after ARP asked again.
    let mut co = String::new();
    let mut cli = n[0].rping_start(&["-c", "-a", "10.0.0.9", "-C", "1"], &mut co);
    let mut res = None;
    let done = run(&mut n, |n| {
        if let Poll::Ready(x) = cli.step(&mut n[0].g.core, &mut co) {
            res = Some(x);
        }
        res.is_some()
    });
    cli.finish(&mut n[0].g.core);
    assert!(done, "rping still resolving after {LIMIT:?}\n{co}");
    let e = res.unwrap().expect_err("no one has 10.0.0.9");
    assert!(
        co.contains("cma event RDMA_CM_EVENT_ADDR_ERROR, error -110"),
        "{e}\n{co}"
    );
    let asked = rx_broadcast(n[1]) - before;
    assert!(
        (2..=3).contains(&asked),
        "{asked} ARP requests in 2 s (one at the start, one a second after)"
    );
    a.finish();
    b.finish();
}
