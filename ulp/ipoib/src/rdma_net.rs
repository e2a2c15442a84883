//! The kernel's IP stack as the RDMA CM's address resolution sees it: ib_core's `addr::IpNet` over a `net::Stack` whose IPoIB links are this crate's and whose Ethernet links (mlx4_en's) carry RoCE.
//!
//! Linux's `addr.c` reads the routing table and the neighbour table of the
//! device a route leaves by; here [`StackNet`] answers those questions for
//! ib_core from the stack's routes and the IPoIB links' own ARP tables.
//! An Ethernet link with a RoCE port behind it (mlx4_en's) names its port
//! through [`net::Link::rdma_port`] and answers [`IpNet::neigh`] from the
//! stack's view of smoltcp's ARP, an ARP request going out when resolution
//! starts and again each second without an answer; its device type is
//! [`ARPHRD_ETHER`](ib_core::addr::ARPHRD_ETHER).

use alloc::string::ToString;

use ib_core::addr::{self, ARPHRD_ETHER, ARPHRD_INFINIBAND, DevAddrBytes, IpNet, IpRoute, NetDev};
use ib_core::device::DeviceId;
use ib_core::error::errno;
use ib_core::{Error, IbCore, Result};
use net::{Ipv4Address, LinkId, LinkKind, Stack};

use crate::IpoibDev;

/// A stack lent to ib_core's address resolution, with the clock it is
/// polled by (microseconds).
pub struct StackNet<'a> {
    /// The stack.
    pub stack: &'a mut Stack<IbCore>,
    /// Its clock.
    pub now_us: &'a dyn Fn(&IbCore) -> u64,
}

impl<'a> StackNet<'a> {
    /// `stack`, polled at `now_us`.
    pub fn new(stack: &'a mut Stack<IbCore>, now_us: &'a dyn Fn(&IbCore) -> u64) -> StackNet<'a> {
        StackNet { stack, now_us }
    }
}

fn ipoib(stack: &mut Stack<IbCore>, id: LinkId) -> Option<&mut IpoibDev> {
    stack.link_mut(id)?.as_any_mut()?.downcast_mut::<IpoibDev>()
}

impl IpNet for StackNet<'_> {
    fn route(&mut self, src: Option<Ipv4Address>, dst: Ipv4Address) -> Result<IpRoute> {
        if let Some(s) = src {
            let ours = self
                .stack
                .links()
                .any(|(id, _)| self.stack.addrs(id).iter().any(|c| c.address() == s));
            if !ours {
                return Err(Error::Errno(errno::EADDRNOTAVAIL));
            }
        }
        let e = self
            .stack
            .route_get(dst)
            .map_err(|_| Error::Errno(errno::ENETUNREACH))?;
        Ok(IpRoute {
            src: src.unwrap_or(e.src),
            next_hop: e.next_hop,
            ifindex: e.dev.0,
            local: e.local,
        })
    }

    fn netdevs(&self, f: &mut dyn FnMut(&NetDev)) {
        for (id, name) in self.stack.links() {
            let Some(l) = self.stack.link(id) else {
                continue;
            };
            let dev_type = match l.kind() {
                LinkKind::Infiniband => ARPHRD_INFINIBAND,
                LinkKind::Ether => ARPHRD_ETHER,
                LinkKind::Loopback => 772,
                LinkKind::None => 65534,
            };
            let rdma_port = l
                .as_any()
                .and_then(|a| a.downcast_ref::<IpoibDev>())
                .map(|d| d.port())
                .or_else(|| l.rdma_port().map(|(h, p)| (DeviceId(h), p)));
            f(&NetDev {
                ifindex: id.0,
                name: name.to_string(),
                dev_type,
                dev_addr: addr::dev_addr_bytes(l.hw_addr().as_bytes()),
                broadcast: addr::dev_addr_bytes(l.broadcast().as_bytes()),
                mtu: l.mtu() as u32,
                carrier: l.carrier(),
                addrs: self
                    .stack
                    .addrs(id)
                    .iter()
                    .map(|c| (c.address(), c.prefix_len()))
                    .collect(),
                rdma_port,
            });
        }
    }

    fn neigh(
        &mut self,
        core: &mut IbCore,
        ifindex: u32,
        ip: Ipv4Address,
        start: bool,
    ) -> Result<Option<DevAddrBytes>> {
        let id = LinkId(ifindex);
        if let Some(d) = ipoib(self.stack, id) {
            return Ok(d
                .neigh_resolve(core, ip, start)?
                .map(|a| addr::dev_addr_bytes(&a.0)));
        }
        // An Ethernet link (RoCE): smoltcp's ARP as the stack saw it; an
        // ARP request goes out when resolution starts.
        if self.stack.link(id).map(|l| l.kind()) != Some(LinkKind::Ether) {
            return Err(Error::Errno(errno::ENODEV));
        }
        let mut mac = None;
        self.stack.neighbours(id, &mut |n| {
            if n.addr == ip
                && let Some(hw) = n.lladdr
            {
                mac = Some(addr::dev_addr_bytes(hw.as_bytes()));
            }
        });
        if mac.is_none() {
            // A request when resolution starts, then one a second while
            // no answer comes (the caller's deadline ends it).
            let sent = if start {
                self.stack.arp_request(id, ip, core)
            } else {
                self.stack.arp_request_again(id, ip, core)
            };
            sent.map_err(|_| Error::Errno(errno::EHOSTUNREACH))?;
        }
        Ok(mac)
    }

    fn poll(&mut self, core: &mut IbCore) {
        let now = (self.now_us)(core);
        self.stack.poll(now, core);
    }
}
