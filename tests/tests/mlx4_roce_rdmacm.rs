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
use net::{Ipv4Cidr, LinkId, Stack};
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
    link: LinkId,
}

impl Node {
    /// mlx4_en's eth0 on port 1 of `g`, with `addr`.
    fn new(mut g: Guest, addr: &str) -> Node {
        let cma = cma::init(&mut g.core);
        let h = g.dev.0;
        let dev = en_dev(&mut g.core, h).expect("mlx4_core under mlx4_ib");
        assert!(dev.protocol_ports(mlx4_core::Protocol::En).contains(&1));
        let en = EnPriv::open(dev, 1, "eth0", h, EnConfig::default())
            .unwrap_or_else(|e| panic!("{}: mlx4_en open: {e}", g.name));
        let mut stack = Stack::new(now_us(&g.core));
        let link = stack
            .add_link("eth0", Box::new(EnLink::<IbCore>::new(en, en_dev)))
            .unwrap();
        stack
            .add_addr(link, Ipv4Cidr::new(addr.parse().unwrap(), 24))
            .unwrap();
        Node {
            g,
            cma,
            stack,
            link,
        }
    }

    /// The kernel's glue (`net::poll`, `roce_sync`, `rdma_cm_poll`).
    fn step(&mut self) -> usize {
        let mut w = self.g.core.poll();
        let now = now_us(&self.g.core);
        w += usize::from(self.stack.poll(now, &mut self.g.core));
        let addrs: Vec<[u8; 4]> = self
            .stack
            .addrs(self.link)
            .iter()
            .map(|c| c.address().octets())
            .collect();
        let mut neigh = Vec::new();
        self.stack.neighbours(self.link, &mut |n| {
            if let Some(mac) = n
                .lladdr
                .and_then(|m| <[u8; 6]>::try_from(m.as_bytes()).ok())
            {
                neigh.push((n.addr.octets(), mac));
            }
        });
        let dev = self.g.dev;
        self.g
            .core
            .device_mut(dev)
            .and_then(|d| d.provider_as::<Mlx4IbDev>())
            .expect("mlx4_ib")
            .sync_roce_netdev(1, None, &addrs, &neigh)
            .expect("RoCE port 1");
        let cma = self.cma;
        w + self.with_net(|core, net| cma::net_poll(core, cma, net))
    }

    fn with_net<R>(&mut self, f: impl FnOnce(&mut IbCore, &mut dyn IpNet) -> R) -> R {
        let now = now_us;
        let mut n = StackNet::new(&mut self.stack, &now);
        f(&mut self.g.core, &mut n)
    }

    fn gid(&self, i: usize) -> Option<Gid> {
        self.g
            .core
            .device(self.g.dev)?
            .port_cache(1)
            .ok()?
            .get_gid(i)
            .ok()
    }

    fn finish(mut self) {
        if let Some(mut l) = self.stack.remove_link(self.link)
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

fn rping_start(n: &mut Node, args: &[&str], out: &mut String) -> Rping {
    let p = rping::Params::parse(args).unwrap();
    let cma = n.cma;
    n.with_net(|core, net| Rping::start(core, cma, net, &p, out))
        .unwrap_or_else(|e| panic!("rping {args:?}: {e}"))
}

/// Two nodes on `--nodes 2 --link-layer eth`, both ports Ethernet, eth0 of
/// A at 10.0.0.1 and of B at 10.0.0.2; the fabric is kept alive by the caller.
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
        .zip(["10.0.0.1", "10.0.0.2"])
        .map(|(h, a)| {
            let cfg = sim::SimConfig {
                port_types: [PortType::Eth, PortType::Eth],
                ..guest_config(h)
            };
            let hca = SimHca::new_on_ports(cfg, &wire, [Some(h.ports[0]), Some(h.ports[1])]);
            Node::new(guest(hca, &h.name), a)
        });
    let a = nodes.next().unwrap();
    let b = nodes.next().unwrap();
    drop(nodes);
    (fabric, a, b)
}

#[test]
fn our_rping_over_roce_through_the_rdma_cm() {
    let (_fabric, mut a, mut b) = two_nodes();
    let mut n = [&mut a, &mut b];
    let up = run(&mut n, |n| {
        n.iter().all(|x| {
            x.stack.carrier(x.link)
                && x.g
                    .core
                    .device(x.g.dev)
                    .and_then(|d| d.port_cache(1).ok())
                    .is_some_and(|c| c.state == Some(PortState::Active))
                && x.gid(1).is_some_and(|g| g.0[10..12] == [0xff, 0xff])
        })
    });
    assert!(up, "both eth0 up, ports Active, IPv4 GIDs written");
    // The GID table has the interface's address (rdma_ip2gid).
    assert_eq!(n[1].gid(1), Some(Gid::new(0, 0xffff_0a00_0002)));

    // `rping -s -a 10.0.0.2 -v` against `rping -c -a 10.0.0.2 -C 10 -v -V`.
    let (mut so, mut co) = (String::new(), String::new());
    let srv = rping_start(n[1], &["-s", "-a", "10.0.0.2", "-v"], &mut so);
    let cli = rping_start(
        n[0],
        &["-c", "-a", "10.0.0.2", "-C", "10", "-v", "-V"],
        &mut co,
    );
    let t = Instant::now();
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
    let took = t.elapsed();
    let [(_, srv, sout, sres), (_, cli, cout, cres)] = rp;
    srv.finish(&mut n[1].g.core);
    cli.finish(&mut n[0].g.core);
    assert!(done, "rping still running after {LIMIT:?}\n{cout}\n{sout}");
    assert!(
        matches!(cres, Some(Ok(()))) && matches!(sres, Some(Ok(()))),
        "client {cres:?}\n{cout}\nserver {sres:?}\n{sout}"
    );
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
    let h = n.g.dev.0;
    let Some(l) = n.stack.link_mut(n.link) else {
        return 0;
    };
    let en = l
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<EnShared>())
        .expect("mlx4_en's link")
        .clone();
    let dev = en_dev(&mut n.g.core, h).expect("mlx4_core");
    en.lock()
        .ethtool_stats(dev)
        .into_iter()
        .find(|(k, _)| k == "rx_broadcast_phy")
        .map_or(0, |x| x.1)
}

#[test]
fn an_address_nobody_answers_for_is_asked_again_each_second_then_an_addr_error() {
    let (_fabric, mut a, mut b) = two_nodes();
    let mut n = [&mut a, &mut b];
    assert!(
        run(&mut n, |n| n.iter().all(
            |x| x.stack.carrier(x.link) && x.gid(1).is_some_and(|g| g.0[10..12] == [0xff, 0xff])
        )),
        "both eth0 up"
    );
    let before = rx_broadcast(n[1]);
    // 10.0.0.9 is on the network but nobody has it: rping's 2 s resolution
    // ends in ADDR_ERROR -ETIMEDOUT, said plainly, after ARP asked again.
    let mut co = String::new();
    let mut cli = rping_start(n[0], &["-c", "-a", "10.0.0.9", "-C", "1"], &mut co);
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
