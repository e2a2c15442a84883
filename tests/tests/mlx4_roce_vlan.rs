//! VLAN devices over mlx4_en and RoCE over them, between driver-run HCAs on the fabric's Ethernet switch: `ip link add link eth0 name eth0.5 type vlan id 5`, ping over the VLAN, the VLAN's GIDs in mlx4_ib's table, `rping -C 10 -V` through the RDMA CM from the VLAN's address, the capture showing every frame of it tagged, and a deleted VLAN device whose VID the card then refuses.
//!
//! Two model HCAs with Ethernet ports (`--nodes 2 --link-layer eth`), each
//! with the real mlx4_core + mlx4_ib + ib_core and mlx4_en's `eth0`
//! (10.0.0.1/24, 10.0.0.2/24) plus the VLAN device `eth0.5` (10.5.0.1/24,
//! 10.5.0.2/24) in one IP stack, glued as the kernel glues them
//! (`kernel/src/net.rs` `roce_sync`: after every pass of the stack mlx4_ib
//! hears each Ethernet link's VLAN, addresses and neighbours).

use std::task::Poll;
use std::time::{Duration, Instant};

use ib_core::addr::IpNet;
use ib_core::cma;
use ib_core::device::DeviceId;
use ib_core::verbs::{Gid, PortState};
use ib_core::{ClientId, IbCore};
use ib_tools::rping::{self, Rping};
use ipoib::rdma_net::StackNet;
use mlx4_en::{EnConfig, EnLink, EnPriv, EnShared};
use mlx4_ib::Mlx4IbDev;
use mlx4_ib::roce::{NO_VLAN, iboe_mac_vlan_to_ll, ipv4_gid};
use net::{Ipv4Cidr, LinkId, Stack};
use sim::fabric::capture::Capture;
use sim::fabric::{Fabric, LinkLayer as SimLl, Topology};
use sim::{PortType, SimHca};
use tests::subnet_common::*;

/// Wall time for anything to happen (debug build, shared machine).
const LIMIT: Duration = Duration::from_secs(60);

fn en_dev(core: &mut IbCore, h: u32) -> Option<&mut mlx4_core::Dev> {
    core.device_mut(DeviceId(h))?
        .provider_as::<Mlx4IbDev>()
        .map(|m| m.core_mut())
}

fn now_us(c: &IbCore) -> u64 {
    c.clock().now_ns() / 1000
}

struct Node {
    g: Guest,
    cma: ClientId,
    stack: Stack<IbCore>,
    eth0: LinkId,
}

impl Node {
    /// mlx4_en's eth0 on port 1 of `g` with `addr`, and `eth0.5` over it
    /// made as a user makes it, with `vaddr`.
    fn new(mut g: Guest, addr: &str, vaddr: &str) -> Node {
        let cma = cma::init(&mut g.core);
        let h = g.dev.0;
        let dev = en_dev(&mut g.core, h).expect("mlx4_core under mlx4_ib");
        let en = EnPriv::open(dev, 1, "eth0", h, EnConfig::default())
            .unwrap_or_else(|e| panic!("{}: mlx4_en open: {e}", g.name));
        let mut stack = Stack::new(now_us(&g.core));
        let eth0 = stack
            .add_link("eth0", Box::new(EnLink::<IbCore>::new(en, en_dev)))
            .unwrap();
        stack
            .add_addr(eth0, Ipv4Cidr::new(addr.parse().unwrap(), 24))
            .unwrap();
        let mut n = Node {
            g,
            cma,
            stack,
            eth0,
        };
        n.ip("link add link eth0 name eth0.5 type vlan id 5")
            .expect("ip link add");
        n.ip(&format!("addr add {vaddr}/24 dev eth0.5"))
            .expect("ip addr add");
        n
    }

    fn ip(&mut self, args: &str) -> Result<String, String> {
        let words: Vec<&str> = args.split_whitespace().collect();
        let mut out = String::new();
        net::iproute::ip(&mut self.stack, Some(&mut self.g.core), &words, &mut out).map(|()| out)
    }

    fn link(&self, name: &str) -> LinkId {
        self.stack.link_id(name).expect(name)
    }

    fn mlx4_ib(&mut self) -> &mut Mlx4IbDev {
        let dev = self.g.dev;
        self.g
            .core
            .device_mut(dev)
            .and_then(|d| d.provider_as::<Mlx4IbDev>())
            .expect("mlx4_ib")
    }

    /// The kernel's glue (`net::poll`, `roce_sync`, `rdma_cm_poll`), for
    /// every Ethernet link.
    fn step(&mut self) -> usize {
        let mut w = self.g.core.poll();
        let now = now_us(&self.g.core);
        w += usize::from(self.stack.poll(now, &mut self.g.core));
        let links: Vec<LinkId> = self.stack.links().map(|(id, _)| id).collect();
        for id in links {
            let Some(vlan) = self
                .stack
                .link(id)
                .filter(|l| l.rdma_port().is_some())
                .map(|l| l.vlan().map(|(v, _)| v))
            else {
                continue;
            };
            let addrs: Vec<[u8; 4]> = self
                .stack
                .addrs(id)
                .iter()
                .map(|c| c.address().octets())
                .collect();
            let mut neigh = Vec::new();
            self.stack.neighbours(id, &mut |n| {
                if let Some(mac) = n
                    .lladdr
                    .and_then(|m| <[u8; 6]>::try_from(m.as_bytes()).ok())
                {
                    neigh.push((n.addr.octets(), mac));
                }
            });
            self.mlx4_ib()
                .sync_roce_netdev(1, vlan, &addrs, &neigh)
                .expect("RoCE port 1");
        }
        let cma = self.cma;
        w + self.with_net(|core, net| cma::net_poll(core, cma, net))
    }

    fn with_net<R>(&mut self, f: impl FnOnce(&mut IbCore, &mut dyn IpNet) -> R) -> R {
        let now = now_us;
        let mut n = StackNet::new(&mut self.stack, &now);
        f(&mut self.g.core, &mut n)
    }

    /// The GIDs in use on port 1 (ib_core's cache), in table order.
    fn gids(&self) -> Vec<Gid> {
        let c = self
            .g
            .core
            .device(self.g.dev)
            .and_then(|d| d.port_cache(1).ok())
            .expect("port 1");
        (0..8)
            .filter_map(|i| c.get_gid(i).ok())
            .filter(|g| g.0 != [0; 16])
            .collect()
    }

    /// A counter of `ethtool -S eth0`.
    fn ethtool(&mut self, name: &str) -> u64 {
        let h = self.g.dev.0;
        let eth0 = self.eth0;
        let en = self
            .stack
            .link_mut(eth0)
            .and_then(|l| l.as_any_mut())
            .and_then(|a| a.downcast_mut::<EnShared>())
            .expect("mlx4_en's link")
            .clone();
        let dev = en_dev(&mut self.g.core, h).expect("mlx4_core");
        en.lock()
            .ethtool_stats(dev)
            .into_iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("no counter {name}"))
            .1
    }

    fn finish(mut self) {
        let vlans: Vec<LinkId> = self
            .stack
            .links()
            .map(|(id, _)| id)
            .filter(|&id| self.stack.link(id).is_some_and(|l| l.vlan().is_some()))
            .collect();
        for id in vlans {
            self.stack.delete_link(id, &mut self.g.core).unwrap();
        }
        if let Some(mut l) = self.stack.remove_link(self.eth0)
            && let Some(en) = l.as_any_mut().and_then(|a| a.downcast_mut::<EnShared>())
            && let Some(d) = en_dev(&mut self.g.core, self.g.dev.0)
        {
            en.lock().close(d);
        }
        self.g.teardown();
    }
}

/// Pumps both nodes until `f` says yes (false after LIMIT).
fn run(n: &mut [&mut Node; 2], mut f: impl FnMut(&mut [&mut Node; 2]) -> bool) -> bool {
    let t = Instant::now();
    loop {
        if f(n) {
            return true;
        }
        if t.elapsed() > LIMIT {
            return false;
        }
        let w = n[0].step() + n[1].step();
        if w == 0 {
            n[0].g.core.clock().delay(IDLE_STEP);
        } else {
            n[0].g.core.clock().relax();
        }
    }
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

fn rping_start(n: &mut Node, args: &[&str], out: &mut String) -> Rping {
    let p = rping::Params::parse(args).unwrap();
    let cma = n.cma;
    n.with_net(|core, net| Rping::start(core, cma, net, &p, out))
        .unwrap_or_else(|e| panic!("rping {args:?}: {e}"))
}

/// Two nodes on `--nodes 2 --link-layer eth`, eth0 and eth0.5 up on both.
fn two_nodes() -> (std::sync::Arc<std::sync::Mutex<Fabric>>, Node, Node) {
    let mut f = Fabric::new();
    let built = Topology::for_nodes_with(2, [SimLl::Eth, SimLl::Eth])
        .unwrap()
        .build(&mut f)
        .unwrap();
    let fabric = std::sync::Arc::new(std::sync::Mutex::new(f));
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    let mut nodes = built
        .hcas
        .iter()
        .take(2)
        .zip([("10.0.0.1", "10.5.0.1"), ("10.0.0.2", "10.5.0.2")])
        .map(|(h, (a, v))| {
            let cfg = sim::SimConfig {
                port_types: [PortType::Eth, PortType::Eth],
                ..guest_config(h)
            };
            let hca = SimHca::new_on_ports(cfg, &wire, [Some(h.ports[0]), Some(h.ports[1])]);
            Node::new(guest(hca, &h.name), a, v)
        });
    let a = nodes.next().unwrap();
    let b = nodes.next().unwrap();
    drop(nodes);
    (fabric, a, b)
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
    let (fabric, mut a, mut b) = two_nodes();
    let mut n = [&mut a, &mut b];
    let (va, vb) = (n[0].link("eth0.5"), n[1].link("eth0.5"));
    let up = run(&mut n, |n| {
        n.iter().all(|x| {
            x.stack.carrier(x.eth0)
                && x.stack.carrier(x.link("eth0.5"))
                && x.g
                    .core
                    .device(x.g.dev)
                    .and_then(|d| d.port_cache(1).ok())
                    .is_some_and(|c| c.state == Some(PortState::Active))
                && x.gids().len() >= 4
        })
    });
    assert!(up, "eth0 and eth0.5 up on both, four GIDs");

    // ip link as iproute2 shows a VLAN device.
    let l = n[0].ip("-d link show eth0.5").unwrap();
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
        let e = n[0].ip(cmd).expect_err(cmd);
        assert!(e.contains(says), "ip {cmd}: {e}");
    }

    // The GID table: the port's link-local and IPv4 GIDs, then the VLAN's
    // (its link-local GID names VLAN 5), each entry with its VLAN.
    let mac = n[0].mlx4_ib().roce_port(1).unwrap().mac;
    let g = n[0].gids();
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
    let (mut so, mut co) = (String::new(), String::new());
    let srv = rping_start(n[1], &["-s", "-a", "10.5.0.2", "-v"], &mut so);
    let cli = rping_start(
        n[0],
        &["-c", "-a", "10.5.0.2", "-C", "10", "-v", "-V"],
        &mut co,
    );
    let mut rp = [(1usize, srv, so, None), (0usize, cli, co, None)];
    let done = run(&mut n, |n| {
        for (who, r, out, res) in rp.iter_mut() {
            if res.is_none()
                && let Poll::Ready(x) = r.step(&mut n[*who].g.core, out)
            {
                *res = Some(x);
            }
        }
        rp.iter().all(|x| x.3.is_some())
    });
    let [(_, srv, sout, sres), (_, cli, cout, cres)] = rp;
    srv.finish(&mut n[1].g.core);
    cli.finish(&mut n[0].g.core);
    assert!(done, "rping still running after {LIMIT:?}\n{cout}\n{sout}");
    assert!(
        matches!(cres, Some(Ok(()))) && matches!(sres, Some(Ok(()))),
        "client {cres:?}\n{cout}\nserver {sres:?}\n{sout}"
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
    n[1].ip("link delete eth0.5").expect("ip link delete");
    assert!(n[1].stack.link_id("eth0.5").is_none());
    assert!(
        run(&mut n, |n| n[1].gids().len() == 2),
        "B's VLAN GIDs gone: {:?}",
        n[1].gids()
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
