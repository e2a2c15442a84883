//! Guests with mlx4_en's `eth0` in an IP stack and the RDMA CM, on the fabric's Ethernet switch: the set-up the RoCE host tests share (`mlx4_roce_rdmacm`, `mlx4_roce_vlan`), glued as the kernel glues them (`kernel/src/net.rs`: after every pass of the stack mlx4_ib hears each Ethernet link's VLAN, addresses and neighbours).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ib_core::addr::IpNet;
use ib_core::cma;
use ib_core::device::DeviceId;
use ib_core::{ClientId, IbCore};
use ib_tools::rping::{self, Rping};
use ipoib::rdma_net::StackNet;
use mlx4_en::{EnConfig, EnLink, EnPriv, EnShared};
use mlx4_ib::Mlx4IbDev;
use net::{Ipv4Cidr, LinkId, Stack};
use sim::fabric::{Fabric, LinkLayer, Topology};
use sim::{PortType, SimHca};

use crate::subnet_common::*;

/// Wall time for anything to happen (debug build, shared machine).
pub const LIMIT: Duration = Duration::from_secs(60);

/// The mlx4_core under the mlx4_ib device `h` of `core` (mlx4_en's
/// `DevGetter`).
pub fn en_dev(core: &mut IbCore, h: u32) -> Option<&mut mlx4_core::Dev> {
    core.device_mut(DeviceId(h))?
        .provider_as::<Mlx4IbDev>()
        .map(|m| m.core_mut())
}

/// The guest's clock in microseconds.
pub fn now_us(c: &IbCore) -> u64 {
    c.clock().now_ns() / 1000
}

/// A guest with mlx4_en's `eth0` on port 1 in its IP stack, and the RDMA
/// CM.
pub struct EthNode {
    pub g: Guest,
    pub cma: ClientId,
    pub stack: Stack<IbCore>,
    pub eth0: LinkId,
}

impl EthNode {
    /// `eth0` on port 1 of `g` with `addr` (/24).
    pub fn new(mut g: Guest, addr: &str) -> EthNode {
        let cma = cma::init(&mut g.core);
        let h = g.dev.0;
        let dev = en_dev(&mut g.core, h).expect("mlx4_core under mlx4_ib");
        assert!(dev.protocol_ports(mlx4_core::Protocol::En).contains(&1));
        let en = EnPriv::open(dev, 1, "eth0", h, EnConfig::default())
            .unwrap_or_else(|e| panic!("{}: mlx4_en open: {e}", g.name));
        let mut stack = Stack::new(now_us(&g.core));
        let eth0 = stack
            .add_link("eth0", Box::new(EnLink::<IbCore>::new(en, en_dev)))
            .unwrap();
        stack
            .add_addr(eth0, Ipv4Cidr::new(addr.parse().unwrap(), 24))
            .unwrap();
        EthNode {
            g,
            cma,
            stack,
            eth0,
        }
    }

    /// The mlx4_ib device.
    pub fn mlx4_ib(&mut self) -> &mut Mlx4IbDev {
        let dev = self.g.dev;
        self.g
            .core
            .device_mut(dev)
            .and_then(|d| d.provider_as::<Mlx4IbDev>())
            .expect("mlx4_ib")
    }

    /// `eth0`'s port (shared with its VLAN devices).
    pub fn en(&mut self) -> EnShared {
        let eth0 = self.eth0;
        self.stack
            .link_mut(eth0)
            .and_then(|l| l.as_any_mut())
            .and_then(|a| a.downcast_mut::<EnShared>())
            .expect("mlx4_en's link")
            .clone()
    }

    /// A counter of `ethtool -S eth0`.
    pub fn ethtool(&mut self, name: &str) -> u64 {
        let en = self.en();
        let dev = en_dev(&mut self.g.core, self.g.dev.0).expect("mlx4_core");
        en.lock()
            .ethtool_stats(dev)
            .into_iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("no counter {name}"))
            .1
    }

    /// The kernel's glue (`net::poll`, `roce_sync`, `rdma_cm_poll`), for
    /// every Ethernet link with a RoCE port behind it.
    pub fn step(&mut self) -> usize {
        let mut w = self.g.core.poll();
        let now = now_us(&self.g.core);
        w += usize::from(self.stack.poll(now, &mut self.g.core));
        let links: Vec<LinkId> = self.stack.links().map(|(id, _)| id).collect();
        let (mut addrs, mut neigh) = (Vec::new(), Vec::new());
        for id in links {
            let Some(r) = self.stack.roce_link(id) else {
                continue;
            };
            self.stack.roce_addrs(id, &mut addrs, &mut neigh);
            self.mlx4_ib()
                .sync_roce_netdev(r.port, r.vlan, &addrs, &neigh)
                .expect("RoCE port");
        }
        let cma = self.cma;
        w + self.with_net(|core, net| cma::net_poll(core, cma, net))
    }

    /// Runs `f` with the stack as the RDMA CM's IP side.
    pub fn with_net<R>(&mut self, f: impl FnOnce(&mut IbCore, &mut dyn IpNet) -> R) -> R {
        let now = now_us;
        let mut n = StackNet::new(&mut self.stack, &now);
        f(&mut self.g.core, &mut n)
    }

    /// Starts our `rping ARGS`, its output into `out`.
    pub fn rping_start(&mut self, args: &[&str], out: &mut String) -> Rping {
        let p = rping::Params::parse(args).unwrap();
        let cma = self.cma;
        self.with_net(|core, net| Rping::start(core, cma, net, &p, out))
            .unwrap_or_else(|e| panic!("rping {args:?}: {e}"))
    }

    /// Deletes the VLAN devices, closes `eth0`, takes the guest down.
    pub fn finish(mut self) {
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

/// Pumps both nodes until `f` says yes (false after [`LIMIT`]).
pub fn run(n: &mut [&mut EthNode; 2], mut f: impl FnMut(&mut [&mut EthNode; 2]) -> bool) -> bool {
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

/// Two nodes on `--nodes 2 --link-layer eth`, both ports Ethernet, `eth0`
/// of each with its address of `addrs`; the fabric is kept alive by the
/// caller.
pub fn two_nodes(addrs: [&str; 2]) -> (Arc<Mutex<Fabric>>, EthNode, EthNode) {
    let mut f = Fabric::new();
    let built = Topology::for_nodes_with(2, [LinkLayer::Eth, LinkLayer::Eth])
        .unwrap()
        .build(&mut f)
        .unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    let mut nodes = built.hcas.iter().take(2).zip(addrs).map(|(h, a)| {
        let cfg = sim::SimConfig {
            port_types: [PortType::Eth, PortType::Eth],
            ..guest_config(h)
        };
        let hca = SimHca::new_on_ports(cfg, &wire, [Some(h.ports[0]), Some(h.ports[1])]);
        EthNode::new(guest(hca, &h.name), a)
    });
    let a = nodes.next().unwrap();
    let b = nodes.next().unwrap();
    drop(nodes);
    (fabric, a, b)
}

/// Our `rping` server on `n[1]` and client on `n[0]` run against each
/// other to the end: each must succeed within [`LIMIT`]. Returns the
/// server's and the client's output.
pub fn rping_pair(n: &mut [&mut EthNode; 2], server: &[&str], client: &[&str]) -> (String, String) {
    let (mut so, mut co) = (String::new(), String::new());
    let srv = n[1].rping_start(server, &mut so);
    let cli = n[0].rping_start(client, &mut co);
    let mut rp = [(1usize, srv, so, None), (0usize, cli, co, None)];
    let done = run(n, |n| {
        for (who, r, out, res) in rp.iter_mut() {
            if res.is_none()
                && let std::task::Poll::Ready(x) = r.step(&mut n[*who].g.core, out)
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
    (sout, cout)
}
