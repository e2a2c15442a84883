//! IP over InfiniBand under the real OpenSM: driver-run HCAs with the whole stack (mlx4_core, mlx4_ib, ib_core, ipoib, net) join OpenSM's IPv4 broadcast group, resolve each other by ARP, ping and echo over TCP; a third node joins later; an SM restart keeps it all working; bad input is counted.
//!
//! Model HCAs on the `--nodes 3` topology under Debian's OpenSM (no
//! partitions.conf: OpenSM makes the broadcast group ff12:401b:ffff::ffff:ffff
//! itself). Each guest runs ib_core's progress function and an IP stack
//! (`net::Stack`) whose `ib0` is the ipoib link of its port, opened once the
//! port's link trains, addressed 10.0.0.N/24. Skipped loudly without the
//! packages (`scripts/deps.sh ensure_ib_peers`).

use tests::subnet_common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ib_core::verbs::EventType;
use ib_core::{ClientId, IbCore};
use ipoib::IpoibDev;
use net::ping::{self, Ping};
use net::{Ipv4Address, Ipv4Cidr, LinkId, Stack};
use sim::fabric::{Fabric, Owner, Topology};
use subnet_common::*;

const UP_LIMIT: Duration = Duration::from_secs(90);
const STEP_LIMIT: Duration = Duration::from_secs(60);

fn ip(s: &str) -> Ipv4Address {
    s.parse().unwrap()
}

/// A guest with its IP stack.
struct Node {
    g: Guest,
    ipoib: ClientId,
    stack: Stack<IbCore>,
    link: Option<LinkId>,
    addr: Ipv4Cidr,
}

impl Node {
    fn new(g: Guest, addr: &str) -> Node {
        let mut g = g;
        let ipoib = ipoib::init(&mut g.core);
        let now = g.core.clock().now_ns() / 1000;
        let (a, len) = addr.split_once('/').unwrap();
        Node {
            g,
            ipoib,
            stack: Stack::new(now),
            link: None,
            addr: Ipv4Cidr::new(ip(a), len.parse().unwrap()),
        }
    }

    /// What the kernel's glue does: a port whose link came up gets its
    /// link registered (with its address); then one pass of the stack.
    fn step(&mut self) {
        for p in ipoib::ports_ready(&mut self.g.core, self.ipoib) {
            let dev = IpoibDev::open(&mut self.g.core, self.ipoib, &p, ipoib::Config::default())
                .unwrap_or_else(|e| panic!("{}: ipoib open: {e}", self.g.name));
            let id = self.stack.add_link(&p.name, Box::new(dev)).unwrap();
            self.stack.add_addr(id, self.addr).unwrap();
            self.link = Some(id);
        }
        let now = self.g.core.clock().now_ns() / 1000;
        self.stack.poll(now, &mut self.g.core);
    }

    fn now_us(&self) -> u64 {
        self.g.core.clock().now_ns() / 1000
    }

    fn carrier(&self) -> bool {
        self.link.is_some_and(|l| self.stack.carrier(l))
    }

    fn dev(&self) -> &IpoibDev {
        self.stack
            .link(self.link.expect("ib0"))
            .and_then(|l| l.as_any())
            .and_then(|a| a.downcast_ref::<IpoibDev>())
            .expect("an ipoib link")
    }

    /// The addresses in the neighbour table.
    fn neigh_addrs(&self) -> Vec<String> {
        self.dev()
            .neigh_table()
            .iter()
            .map(|n| n.ip.to_string())
            .collect()
    }

    fn ip(&mut self, args: &str) -> String {
        let words: Vec<&str> = args.split_whitespace().collect();
        let mut out = String::new();
        net::iproute::ip(&mut self.stack, None, &words, &mut out).expect("ip");
        out
    }

    fn stats(&self) -> net::LinkStats {
        self.stack.stats(self.link.expect("ib0")).unwrap()
    }

    /// The link out of the stack and closed (QP, CQs, AHs destroyed, the
    /// group left), then the device away.
    fn teardown(mut self) {
        if let Some(id) = self.link.take()
            && let Some(mut l) = self.stack.remove_link(id)
            && let Some(d) = l.as_any_mut().and_then(|a| a.downcast_mut::<IpoibDev>())
        {
            d.close(&mut self.g.core);
        }
        self.g.teardown();
    }
}

/// Runs every node's progress function, the SM server and the stacks
/// until `done` or `limit`.
fn run(
    sm: &mut OpenSm,
    nodes: &mut [&mut Node],
    limit: Duration,
    mut done: impl FnMut(&mut [&mut Node]) -> bool,
) -> bool {
    let t = Instant::now();
    let mut idle = 0u32;
    loop {
        let work = {
            let mut gs: Vec<&mut Guest> = nodes.iter_mut().map(|n| &mut n.g).collect();
            sm.round(&mut gs)
        };
        for n in nodes.iter_mut() {
            n.step();
        }
        if done(nodes) {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        if work == 0 {
            idle += 1;
            if idle > 32 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::thread::yield_now();
            }
        } else {
            idle = 0;
        }
    }
}

/// `ping ARGS` on node `from` (index in `nodes`) while everything runs;
/// the transcript and whether it succeeded.
fn ping(sm: &mut OpenSm, nodes: &mut [&mut Node], from: usize, args: &str) -> (String, bool) {
    let words: Vec<&str> = args.split_whitespace().collect();
    let o = ping::parse(&words).unwrap();
    let mut out = String::new();
    let now = nodes[from].now_us();
    let mut p = match Ping::start(&mut nodes[from].stack, o, now, &mut out) {
        Ok(p) => p,
        Err(e) => return (e, false),
    };
    let mut going = true;
    run(sm, nodes, STEP_LIMIT, |n| {
        let now = n[from].now_us();
        going = p.step(&mut n[from].stack, now, &mut out);
        !going
    });
    assert!(!going, "ping ran past {STEP_LIMIT:?}:\n{out}");
    let ok = p.finish(&mut nodes[from].stack, &mut out);
    (out, ok)
}

/// Every request of a ping was answered; if not, the transcript, whether
/// the switch routes the broadcast group to every node, and what each node
/// counted (ARP, path queries, held and dropped packets).
fn assert_no_loss(sm: &OpenSm, nodes: &[&Node], out: &str, n: u32) {
    if out.contains(&format!(
        "{n} packets transmitted, {n} received, 0% packet loss"
    )) {
        return;
    }
    let counted: Vec<String> = nodes
        .iter()
        .map(|x| format!("{}: {:?}", x.g.name, x.dev().counters()))
        .collect();
    panic!(
        "{out}\nbroadcast group routed to every node: {}\n{}",
        mcast_routed(&sm.fabric, nodes),
        counted.join("\n")
    );
}

/// 1 MiB through the peer's TCP echo (port 7) from node `from`; returns
/// the wall time it took.
fn tcp_echo(sm: &mut OpenSm, nodes: &mut [&mut Node], from: usize, dst: &str) -> (Duration, u64) {
    const TOTAL: usize = 1 << 20;
    let data: Vec<u8> = (0..TOTAL)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8)) as u8)
        .collect();
    let s = nodes[from]
        .stack
        .tcp_connect(ip(dst), 7, 40000, 64 * 1024)
        .unwrap();
    let (mut sent, mut got) = (0usize, 0usize);
    let mut buf = vec![0u8; 16 * 1024];
    let t = Instant::now();
    let m0 = nodes[from].now_us();
    let ok = run(sm, nodes, Duration::from_secs(240), |n| {
        let sock = n[from].stack.tcp(s).unwrap();
        if sock.can_send() && sent < TOTAL {
            sent += sock.send_slice(&data[sent..]).unwrap();
        }
        while sock.can_recv() {
            let k = sock.recv_slice(&mut buf).unwrap();
            if k == 0 {
                break;
            }
            assert_eq!(&buf[..k], &data[got..got + k], "echoed bytes at {got}");
            got += k;
        }
        got == TOTAL
    });
    assert!(ok, "1 MiB echoed: sent {sent}, got {got}");
    let wall = t.elapsed();
    let model_us = nodes[from].now_us() - m0;
    nodes[from].stack.tcp(s).unwrap().close();
    run(sm, nodes, Duration::from_secs(10), |n| {
        !n[from].stack.tcp(s).unwrap().is_open()
            || n[from].stack.tcp(s).unwrap().state() == net::smoltcp::socket::tcp::State::TimeWait
    });
    nodes[from].stack.close(s);
    (wall, model_us)
}

struct Subnet {
    built: sim::fabric::Built,
    wire: sim::Wire,
    sm: OpenSm,
}

fn subnet(test: &str, nodes: usize, args: &[&str]) -> Subnet {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(nodes).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    // OpenSM first (one OpenSM test at a time), the guests after it.
    let sm = OpenSm::start(test, &fabric, built.switches[0].1, true, args);
    Subnet { built, wire, sm }
}

impl Subnet {
    fn guest(&self, i: usize, addr: &str) -> Node {
        let h = &self.built.hcas[i];
        let hca = sim::SimHca::new_on_ports(
            guest_config(h),
            &self.wire,
            [Some(h.ports[0]), Some(h.ports[1])],
        );
        Node::new(guest(hca, &h.name), addr)
    }
}

/// Whether the switch forwards every node's broadcast group to every node.
///
/// OpenSM answers a join before the switches know of it: its SA adds the
/// port to the group, asks the state manager to route the group again
/// (`osm_sm_reroute_mlid`) and responds, and the MulticastForwardingTable
/// is set later. Until then a node has its carrier but the group's packets
/// do not reach it: an ARP request sent then is lost and asked again a
/// second later, and of the packets held for the neighbour meanwhile only
/// three are kept (a ping at 0.2 s loses its fourth and fifth).
fn mcast_routed<N: std::ops::Deref<Target = Node>>(fabric: &Mutex<Fabric>, nodes: &[N]) -> bool {
    // Each node's ib0 port on the fabric, asked of its model before the
    // fabric is locked.
    let Some(ports) = nodes
        .iter()
        .map(|n| n.g.hca.fabric_port(1))
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    let f = fabric.lock().unwrap_or_else(|e| e.into_inner());
    nodes.iter().all(|n| {
        let Some(r) = n.link.and_then(|_| n.dev().bcast_record()) else {
            return false;
        };
        ports
            .iter()
            .all(|&m| match f.peer(m).and_then(|p| f.owner(p)) {
                Some(Owner::Switch { switch, port }) => f
                    .switch(switch)
                    .is_some_and(|s| s.mft_ports(r.mlid).contains(&port)),
                _ => false,
            })
    })
}

/// Every ib0 has its carrier, and the switch forwards the broadcast group
/// to every node ([`mcast_routed`]).
fn up(sm: &mut OpenSm, nodes: &mut [&mut Node]) {
    let fabric = sm.fabric.clone();
    let ok = run(sm, nodes, UP_LIMIT, |n| {
        n.iter().all(|x| x.carrier()) && mcast_routed(&fabric, n)
    });
    let states: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                "{}: carrier {} {:?}",
                n.g.name,
                n.carrier(),
                n.link.map(|_| n.dev().counters())
            )
        })
        .collect();
    assert!(
        ok,
        "every ib0 up and the broadcast group routed to each ({}): {states:#?}\n{}",
        mcast_routed(&fabric, nodes),
        sm.current_log()
    );
}

#[test]
fn ipoib_nodes_under_opensm_ping_echo_and_survive_an_sm_restart() {
    if !peers_present("ipoib_nodes_under_opensm_ping_echo_and_survive_an_sm_restart") {
        return;
    }
    let mut s = subnet("ipoib", 3, &["-s", "1"]);
    let mut a = s.guest(0, "10.0.0.1/24");
    let mut b = s.guest(1, "10.0.0.2/24");
    let sm = &mut s.sm;
    up(sm, &mut [&mut a, &mut b]);
    for n in [&a, &b] {
        let r = n.dev().bcast_record().expect("joined");
        assert_eq!((r.qkey, r.mtu), (0x0b1b, 4), "OpenSM's group: {r:?}");
        assert_eq!(n.dev().addr().flags(), 0, "datagram mode only");
    }
    // ARP, then the pings, both ways.
    let (out, ok) = ping(sm, &mut [&mut a, &mut b], 0, "-c 5 -i 0.2 10.0.0.2");
    eprintln!("{out}");
    assert!(ok, "{out}");
    assert_no_loss(sm, &[&a, &b], &out, 5);
    assert!(out.starts_with("PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.\n"));
    let (out, ok) = ping(sm, &mut [&mut a, &mut b], 1, "-c 5 -i 0.2 10.0.0.1");
    assert!(ok, "{out}");
    assert_no_loss(sm, &[&a, &b], &out, 5);
    // ip neigh on each side: the peer's 20-byte address (flags 0, its
    // QPN, its port GID).
    let b_hw = b.dev().addr();
    let neigh = a.ip("neigh");
    eprintln!("a: ip neigh:\n{neigh}");
    assert!(
        neigh.contains(&format!("10.0.0.2 dev ib0 lladdr {b_hw} REACHABLE")),
        "{neigh}"
    );
    let a_hw = a.dev().addr();
    assert!(
        b.ip("neigh")
            .contains(&format!("10.0.0.1 dev ib0 lladdr {a_hw} ")),
        "{}",
        b.ip("neigh")
    );
    let link = a.ip("link show ib0");
    eprintln!("{link}");
    assert!(
        link.contains(&format!(
            "link/infiniband {a_hw} brd 00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff"
        )),
        "{link}"
    );
    assert!(link.contains("mtu 2044"), "{link}");
    // The path to b came from the SA and made an address handle.
    let c = a.dev().counters();
    assert!(c.path_queries >= 1 && c.path_ahs >= 1, "{c:?}");
    assert!(c.arp_requests_tx >= 1 && c.arp_rx >= 1, "{c:?}");
    // 1 MiB through b's TCP echo.
    let (wall, model_us) = tcp_echo(sm, &mut [&mut a, &mut b], 0, "10.0.0.2");
    eprintln!(
        "TCP echo of 1 MiB: {wall:?} wall, {} ms of model time ({:.2} MB/s each way, model time)",
        model_us / 1000,
        (1u64 << 20) as f64 / model_us.max(1) as f64
    );

    // A third node joins later and is reached.
    let mut c3 = s.guest(2, "10.0.0.3/24");
    let sm = &mut s.sm;
    up(sm, &mut [&mut a, &mut b, &mut c3]);
    let (out, ok) = ping(
        sm,
        &mut [&mut a, &mut b, &mut c3],
        0,
        "-c 3 -i 0.2 10.0.0.3",
    );
    assert!(ok, "{out}");
    assert_no_loss(sm, &[&a, &b, &c3], &out, 3);
    let (out, ok) = ping(
        sm,
        &mut [&mut a, &mut b, &mut c3],
        2,
        "-c 3 -i 0.2 10.0.0.2",
    );
    assert!(ok, "{out}");
    assert_no_loss(sm, &[&a, &b, &c3], &out, 3);

    // A new OpenSM asks every port to re-register: the groups are joined
    // again, the paths asked for again, and the links carry on.
    let joins0: Vec<u64> = [&a, &b, &c3]
        .iter()
        .map(|n| n.dev().counters().joins)
        .collect();
    let queries0 = a.dev().counters().path_queries;
    let ev0 = a.g.events().len();
    {
        let mut gs = [&mut a.g, &mut b.g, &mut c3.g];
        sm.restart(&mut gs, &["-s", "1"]);
    }
    let fabric = sm.fabric.clone();
    let ok = run(sm, &mut [&mut a, &mut b, &mut c3], UP_LIMIT, |n| {
        n.iter()
            .zip(&joins0)
            .all(|(x, j)| x.carrier() && x.dev().counters().joins > *j)
            && mcast_routed(&fabric, n)
    });
    assert!(
        ok,
        "every node joined again after the restart:\n{}",
        sm.current_log()
    );
    assert!(
        a.g.events()[ev0..].contains(&(EventType::ClientReregister, 1)),
        "{:?}",
        a.g.events()
    );
    let (out, ok) = ping(
        sm,
        &mut [&mut a, &mut b, &mut c3],
        0,
        "-c 5 -i 0.2 10.0.0.2",
    );
    assert!(ok, "{out}");
    assert_no_loss(sm, &[&a, &b, &c3], &out, 5);
    let (out, ok) = ping(
        sm,
        &mut [&mut a, &mut b, &mut c3],
        2,
        "-c 3 -i 0.2 10.0.0.1",
    );
    assert!(ok, "{out}");
    assert_no_loss(sm, &[&a, &b, &c3], &out, 3);
    let c = a.dev().counters();
    assert!(c.path_flushes >= 1, "paths marked for a new query: {c:?}");
    assert!(
        c.path_queries > queries0,
        "the path to b asked for again: {c:?}"
    );
    eprintln!("a: {c:?}\na: {:?}", a.stats());
    // Nothing was dropped for want of resolution along the way.
    assert_eq!(
        (c.tx_unresolved, c.tx_no_path, c.tx_queue_full),
        (0, 0, 0),
        "{c:?}"
    );
    s.sm.stop();
    for n in [a, b, c3] {
        n.teardown();
    }
}

/// A raw UD QP on a guest that sends whatever bytes it is given to a QPN
/// (the frames a broken or hostile peer would send).
struct Injector {
    qp: ib_core::verbs::Qp,
    cq: ib_core::verbs::Cq,
    ah: ib_core::verbs::Ah,
    mr: ib_core::verbs::Mr,
    pd: ib_core::verbs::Pd,
    buf: hal::dma::DmaBuf,
    sent: u64,
}

impl Injector {
    fn new(n: &mut Node, dlid: u16) -> Injector {
        use ib_core::verbs::*;
        let d = n.g.core.device_mut(n.g.dev).unwrap();
        let pd = d.alloc_pd().unwrap();
        let (cq, _) = d
            .create_cq(&CqInitAttr {
                cqe: 64,
                comp_vector: 0,
            })
            .unwrap();
        let (qp, _) = d
            .create_qp(
                pd,
                &QpInitAttr {
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: 32,
                        max_recv_wr: 1,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_type: SigType::AllWr,
                    qp_type: QpType::Ud,
                    create_flags: QpCreateFlags::empty(),
                    port_num: 1,
                },
            )
            .unwrap();
        type M = QpAttrMask;
        for (a, m) in [
            (
                QpAttr {
                    qp_state: QpState::Init,
                    port_num: 1,
                    pkey_index: 0,
                    qkey: 0x0b1b,
                    ..Default::default()
                },
                M::STATE | M::PORT | M::PKEY_INDEX | M::QKEY,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rtr,
                    ..Default::default()
                },
                M::STATE,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rts,
                    ..Default::default()
                },
                M::STATE | M::SQ_PSN,
            ),
        ] {
            d.modify_qp(qp, &a, m).unwrap();
        }
        let ah = d
            .create_ah(
                pd,
                &AhAttr {
                    dlid,
                    port_num: 1,
                    ..AhAttr::default()
                },
            )
            .unwrap();
        let mr = d.get_dma_mr(pd, AccessFlags::LOCAL_WRITE).unwrap();
        let buf = d.provider().dma_pool().alloc(4096, 4096).unwrap();
        Injector {
            qp,
            cq,
            ah,
            mr,
            pd,
            buf,
            sent: 0,
        }
    }

    fn send(&mut self, n: &mut Node, qpn: u32, bytes: &[u8]) {
        use ib_core::verbs::*;
        // Wait for the previous send: one slot of the buffer.
        let d = n.g.core.device_mut(n.g.dev).unwrap();
        let mut wc = [Wc::default(); 8];
        while self.sent > 0 {
            let k = d.poll_cq(self.cq, &mut wc).unwrap();
            self.sent -= k as u64;
            if k == 0 {
                break;
            }
        }
        self.buf.write_bytes(0, bytes);
        let sge = [Sge {
            addr: self.buf.bus_addr().0,
            length: bytes.len() as u32,
            lkey: self.mr.lkey,
        }];
        d.post_send(
            self.qp,
            &[SendWr {
                wr_id: 1,
                sg_list: &sge,
                opcode: WrOpcode::Send,
                send_flags: SendFlags::SIGNALED,
                wr: WrDetail::Ud {
                    ah: self.ah,
                    remote_qpn: qpn,
                    remote_qkey: 0x0b1b,
                    pkey_index: 0,
                    port_num: 1,
                },
                ..SendWr::default()
            }],
        )
        .unwrap();
        self.sent += 1;
    }

    fn destroy(self, n: &mut Node) {
        let d = n.g.core.device_mut(n.g.dev).unwrap();
        let _ = d.destroy_qp(self.qp);
        let _ = d.destroy_ah(self.ah);
        let _ = d.dereg_mr(self.mr);
        let _ = d.destroy_cq(self.cq);
        let _ = d.dealloc_pd(self.pd);
    }
}

fn arp_frame(
    op: u16,
    sha: ipoib::IpoibAddr,
    sip: &str,
    tha: ipoib::IpoibAddr,
    tip: &str,
) -> Vec<u8> {
    let p = ipoib::arp::ArpPacket {
        op,
        sha,
        sip: ip(sip),
        tha,
        tip: ip(tip),
    };
    let mut f = vec![0u8; 4 + ipoib::arp::ARP_LEN];
    ipoib::put_header(&mut f, ipoib::ETH_P_ARP);
    p.emit(&mut f[4..]);
    f
}

#[test]
fn bad_frames_and_unanswered_pings_are_counted_and_the_link_carries_on() {
    if !peers_present("bad_frames_and_unanswered_pings_are_counted_and_the_link_carries_on") {
        return;
    }
    let mut s = subnet("ipoib-bad", 2, &["-s", "1"]);
    let mut a = s.guest(0, "10.0.0.1/24");
    let mut b = s.guest(1, "10.0.0.2/24");
    let sm = &mut s.sm;
    up(sm, &mut [&mut a, &mut b]);
    let a_qpn = a.dev().addr().qpn();
    let a_lid = a.g.port(1).lid;
    let mut inj = Injector::new(&mut b, a_lid);
    let c0 = a.dev().counters();
    let s0 = a.stats();
    let stranger = ipoib::IpoibAddr::new(0x123, &b.dev().addr().gid());
    let mut mcast_gid = b.dev().addr();
    mcast_gid.0[4] = 0xff;
    let mut frames: Vec<Vec<u8>> = vec![
        vec![0x08],                                      // shorter than the header
        vec![0x86, 0xdd, 0, 0, 0x60, 0, 0, 0],           // IPv6: not ours
        vec![0x88, 0x8e, 0, 0],                          // another EtherType, empty
        [&[0x08, 0x00, 0, 0][..], &[0x45; 10]].concat(), // IPv4 too short
        [&[0x08, 0x00, 0, 0][..], &[0x65; 40]].concat(), // not version 4
        [&[0x08, 0x06, 0, 0][..], &[0; 20]].concat(),    // ARP, truncated
        // An ARP reply nobody asked for.
        arp_frame(2, stranger, "10.0.0.77", a.dev().addr(), "10.0.0.1"),
        // ARP from a multicast "address".
        arp_frame(1, mcast_gid, "10.0.0.78", Default::default(), "10.0.0.1"),
        // An IPv4 packet with a bad header checksum (the stack's check).
        {
            let mut f = vec![0x08, 0x00, 0, 0];
            let mut h = [0u8; 28];
            h[0] = 0x45;
            h[3] = 28;
            h[8] = 64;
            h[9] = 1;
            h[10] = 0xde;
            h[12..16].copy_from_slice(&[10, 0, 0, 2]);
            h[16..20].copy_from_slice(&[10, 0, 0, 1]);
            f.extend_from_slice(&h);
            f
        },
    ];
    // And a few hundred random ones (random type, random length).
    let mut x = 0x5eed_u64;
    for i in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 120) as usize;
        let mut f: Vec<u8> = (0..len).map(|k| (x >> (k % 56)) as u8 ^ k as u8).collect();
        if len >= 4 {
            let t: u16 = [0x0800, 0x0806, 0x86dd, 0x1234][i % 4];
            f[..2].copy_from_slice(&t.to_be_bytes());
        }
        frames.push(f);
    }
    let total = frames.len();
    for f in &frames {
        inj.send(&mut b, a_qpn, f);
        run(sm, &mut [&mut a, &mut b], Duration::from_millis(20), |_| {
            false
        });
    }
    run(sm, &mut [&mut a, &mut b], Duration::from_secs(2), |_| false);
    let c = a.dev().counters();
    let st = a.stats();
    eprintln!("after {total} bad frames: {c:?}\n{st:?}");
    assert!(c.rx_short > c0.rx_short, "{c:?}");
    assert!(c.rx_unknown_type >= c0.rx_unknown_type + 2, "{c:?}");
    assert!(c.rx_bad_ipv4 >= c0.rx_bad_ipv4 + 2, "{c:?}");
    assert!(c.arp_bad >= c0.arp_bad + 2, "{c:?}");
    assert!(c.arp_unsolicited > c0.arp_unsolicited, "{c:?}");
    assert!(
        a.neigh_addrs().iter().all(|n| n != "10.0.0.77"),
        "an unsolicited reply made no entry: {}",
        a.ip("neigh")
    );
    let counted = (st.rx_errors + st.rx_dropped) - (s0.rx_errors + s0.rx_dropped);
    assert!(counted as usize >= 9, "{st:?}");
    // The link carries on.
    assert!(a.carrier());
    let (out, ok) = ping(sm, &mut [&mut a, &mut b], 0, "-c 3 -i 0.2 10.0.0.2");
    assert!(ok, "{out}");
    assert_no_loss(sm, &[&a, &b], &out, 3);

    // A ping nobody answers: ARP asks three times, the neighbour fails, the
    // requests are counted drops, the ping ends at its deadline.
    let t = Instant::now();
    let (out, ok) = ping(sm, &mut [&mut a, &mut b], 0, "-c 2 -i 0.2 -W 5 10.0.0.99");
    eprintln!("{out}\n{}", a.ip("neigh"));
    assert!(!ok, "{out}");
    assert!(
        out.contains("2 packets transmitted, 0 received") && out.contains("100% packet loss"),
        "{out}"
    );
    assert!(t.elapsed() < Duration::from_secs(30));
    run(sm, &mut [&mut a, &mut b], Duration::from_secs(5), |n| {
        n[0].dev().counters().neigh_failed > 0
    });
    let c = a.dev().counters();
    assert!(c.neigh_failed >= 1 && c.tx_unresolved >= 1, "{c:?}");
    assert!(
        a.ip("neigh").contains("10.0.0.99 dev ib0 FAILED"),
        "{}",
        a.ip("neigh")
    );
    // ... and b is still reached.
    let (out, ok) = ping(sm, &mut [&mut a, &mut b], 0, "-c 3 -i 0.2 10.0.0.2");
    assert!(ok, "{out}");
    assert_no_loss(sm, &[&a, &b], &out, 3);
    inj.destroy(&mut b);
    s.sm.stop();
    a.teardown();
    b.teardown();
}

#[test]
fn a_refused_broadcast_join_keeps_the_carrier_down_and_is_counted() {
    if !peers_present("a_refused_broadcast_join_keeps_the_carrier_down_and_is_counted") {
        return;
    }
    // A partitions.conf without `ipoib`: OpenSM makes no broadcast group,
    // and a join without the create components is refused.
    let dir = tests::target_tmpdir().join(format!("ipoib-nogroup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("partitions.conf");
    std::fs::write(&conf, "Default=0x7fff : ALL=full ;\n").unwrap();
    let conf = conf.display().to_string();
    let mut s = subnet("ipoib-nogroup", 2, &["-s", "1", "-P", &conf]);
    let mut a = s.guest(0, "10.0.0.1/24");
    let mut b = s.guest(1, "10.0.0.2/24");
    let sm = &mut s.sm;
    let ok = run(sm, &mut [&mut a, &mut b], UP_LIMIT, |n| {
        n.iter()
            .all(|x| x.link.is_some() && x.dev().counters().join_failures >= 2)
    });
    assert!(ok, "joins refused and tried again:\n{}", sm.current_log());
    for n in [&mut a, &mut b] {
        assert!(!n.carrier(), "{}: no carrier without the group", n.g.name);
        assert!(n.dev().bcast_record().is_none());
        assert!(n.g.active(), "the port itself is Active");
    }
    assert!(
        a.ip("link show ib0").contains("NO-CARRIER"),
        "{}",
        a.ip("link show ib0")
    );
    // A ping has nothing to go by: every request a counted carrier drop,
    // the ping ends at its deadline.
    let (out, ok) = ping(sm, &mut [&mut a, &mut b], 0, "-c 2 -i 0.2 -W 1 10.0.0.2");
    assert!(!ok && out.contains("100% packet loss"), "{out}");
    assert!(a.stats().tx_carrier_errors >= 2, "{:?}", a.stats());
    s.sm.stop();
    a.teardown();
    b.teardown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_broadcast_group_with_a_larger_mtu_than_the_port_is_not_joined_and_is_counted() {
    if !peers_present(
        "a_broadcast_group_with_a_larger_mtu_than_the_port_is_not_joined_and_is_counted",
    ) {
        return;
    }
    // OpenSM makes the broadcast group with MTU 4096 (`mtu=5`), and node 0's
    // cable goes into a switch port that carries 2048 at most: OpenSM sets
    // NeighborMTU 2048 on both ends of that cable, node 1's stays 4096.
    let dir = tests::target_tmpdir().join(format!("ipoib-mtu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("partitions.conf");
    std::fs::write(&conf, "Default=0x7fff, ipoib, mtu=5 : ALL=full ;\n").unwrap();
    let conf = conf.display().to_string();
    let mut s = subnet("ipoib-mtu", 2, &["-s", "1", "-P", &conf]);
    {
        let fabric = s.wire.fabric();
        let mut f = fabric.lock().unwrap();
        let peer = f.peer(s.built.hcas[0].ports[0]).expect("node 0 cabled");
        let Some(sim::fabric::Owner::Switch { switch, port }) = f.owner(peer) else {
            panic!("node 0 is cabled to a switch");
        };
        assert!(f.switch_mut(switch).unwrap().set_mtu_cap(port, 4));
    }
    let mut a = s.guest(0, "10.0.0.1/24");
    let mut b = s.guest(1, "10.0.0.2/24");
    let sm = &mut s.sm;
    let ok = run(sm, &mut [&mut a, &mut b], UP_LIMIT, |n| {
        n[1].carrier() && n[0].link.is_some() && n[0].dev().counters().join_failures >= 2
    });
    assert!(
        ok,
        "node 1 joined, node 0 refused twice: {:?} {:?}\n{}",
        a.link.map(|_| a.dev().counters()),
        b.link.map(|_| b.dev().counters()),
        sm.current_log()
    );
    assert_eq!(a.g.port(1).active_mtu, ib_core::verbs::Mtu::Mtu2048);
    assert_eq!(b.g.port(1).active_mtu, ib_core::verbs::Mtu::Mtu4096);
    let r = b.dev().bcast_record().expect("node 1 joined");
    assert_eq!(r.mtu, ib_core::verbs::Mtu::Mtu4096 as u8, "{r:?}");
    // Node 0: the refusal is a clear error, counted, and keeps the
    // carrier down (and the QP off the group).
    let why = a.dev().join_error();
    eprintln!("node 0's join: {why:?}; {:?}", a.dev().counters());
    assert!(why.is_some());
    assert!(!a.carrier() && a.dev().bcast_record().is_none());
    assert!(a.g.active(), "the port itself is Active");
    assert!(
        a.ip("link show ib0").contains("NO-CARRIER"),
        "{}",
        a.ip("link show ib0")
    );
    // Its ping is a counted carrier drop that ends at its deadline; node 1's
    // ARP for it goes unanswered (node 0 is not in the group) and fails.
    let (out, ok) = ping(sm, &mut [&mut a, &mut b], 0, "-c 1 -W 1 10.0.0.2");
    assert!(!ok && out.contains("100% packet loss"), "{out}");
    assert!(a.stats().tx_carrier_errors >= 1, "{:?}", a.stats());
    let (out, ok) = ping(sm, &mut [&mut a, &mut b], 1, "-c 1 -W 1 10.0.0.1");
    assert!(!ok && out.contains("100% packet loss"), "{out}");
    // The multicast client keeps trying (with backoff): more refusals.
    let before = a.dev().counters().join_failures;
    let more = run(sm, &mut [&mut a, &mut b], STEP_LIMIT, |n| {
        n[0].dev().counters().join_failures > before
    });
    assert!(more && !a.carrier());
    s.sm.stop();
    a.teardown();
    b.teardown();
    let _ = std::fs::remove_dir_all(&dir);
}
