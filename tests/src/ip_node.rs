//! Guests with IPoIB, the IP stack and the RDMA CM on a fabric under the real OpenSM: the set-up the RDMA CM's and rmem's host tests share.

use std::sync::{Arc, Mutex};

use ib_core::addr::IpNet;
use ib_core::cma;
use ib_core::{ClientId, IbCore};
use ipoib::IpoibDev;
use ipoib::rdma_net::StackNet;
use net::{Ipv4Cidr, LinkId, Stack};
use sim::fabric::{Fabric, Topology};

use crate::subnet_common::*;

/// A guest with its IP stack and RDMA CM.
pub struct Node {
    pub g: Guest,
    pub ipoib: ClientId,
    pub cma: ClientId,
    pub stack: Stack<IbCore>,
    pub link: Option<LinkId>,
    pub addr: Ipv4Cidr,
}

pub fn now_us(c: &IbCore) -> u64 {
    c.clock().now_ns() / 1000
}

impl Node {
    pub fn new(g: Guest, addr: &str) -> Node {
        let mut g = g;
        let ipoib = ipoib::init(&mut g.core);
        let cma = cma::init(&mut g.core);
        let now = now_us(&g.core);
        let (a, len) = addr.split_once('/').unwrap();
        Node {
            g,
            ipoib,
            cma,
            stack: Stack::new(now),
            link: None,
            addr: Ipv4Cidr::new(a.parse().unwrap(), len.parse().unwrap()),
        }
    }

    /// The kernel's glue: a port whose link came up gets its link; then
    /// one pass of the stack and the RDMA CM's turn with it.
    pub fn step(&mut self) {
        for p in ipoib::ports_ready(&mut self.g.core, self.ipoib) {
            let dev = IpoibDev::open(&mut self.g.core, self.ipoib, &p, ipoib::Config::default())
                .unwrap_or_else(|e| panic!("{}: ipoib open: {e}", self.g.name));
            let id = self.stack.add_link(&p.name, Box::new(dev)).unwrap();
            self.stack.add_addr(id, self.addr).unwrap();
            self.link = Some(id);
        }
        let now = now_us(&self.g.core);
        self.stack.poll(now, &mut self.g.core);
        let cma = self.cma;
        self.with_net(|core, net| cma::net_poll(core, cma, net));
    }

    pub fn with_net<R>(&mut self, f: impl FnOnce(&mut IbCore, &mut dyn IpNet) -> R) -> R {
        let now = now_us;
        let mut n = StackNet::new(&mut self.stack, &now);
        f(&mut self.g.core, &mut n)
    }

    pub fn carrier(&self) -> bool {
        self.link.is_some_and(|l| self.stack.carrier(l))
    }

    pub fn teardown(mut self) {
        if let Some(id) = self.link.take()
            && let Some(mut l) = self.stack.remove_link(id)
            && let Some(d) = l.as_any_mut().and_then(|a| a.downcast_mut::<IpoibDev>())
        {
            d.close(&mut self.g.core);
        }
        self.g.teardown();
    }
}

pub struct Subnet {
    pub built: sim::fabric::Built,
    pub wire: sim::Wire,
    pub sm: OpenSm,
}

pub fn subnet(test: &str, nodes: usize) -> Subnet {
    let mut f = Fabric::new();
    let built = Topology::for_nodes(nodes).unwrap().build(&mut f).unwrap();
    let fabric = Arc::new(Mutex::new(f));
    let wire = sim::Wire::over(fabric.clone(), sim::SimConfig::default().relax_step);
    let sm = OpenSm::start(test, &fabric, built.switches[0].1, true, &[]);
    Subnet { built, wire, sm }
}

impl Subnet {
    pub fn guest(&self, i: usize, addr: &str) -> Node {
        let h = &self.built.hcas[i];
        let hca = sim::SimHca::new_on_ports(
            guest_config(h),
            &self.wire,
            [Some(h.ports[0]), Some(h.ports[1])],
        );
        Node::new(guest(hca, &h.name), addr)
    }
}
