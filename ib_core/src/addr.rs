//! Port of Linux `drivers/infiniband/core/addr.c` (6.1), busy-polled: resolving an IPv4 address to the hardware addresses, RDMA device and port that reach it, through the kernel's IP stack.
//!
//! Linux's `addr.c` asks the routing table (`ip_route_output_key`) and the
//! neighbour subsystem (ARP) itself. ib_core sits below the IP stack here,
//! so the IP side comes in through a trait, [`IpNet`], implemented by the
//! code that owns the stack (ipoib's `rdma_net` for IPoIB links; an
//! Ethernet port's link answers the same questions for RoCE, with
//! [`ARPHRD_ETHER`] as its device type). A request that waits for ARP is
//! tried again each time the IP side is pumped (`cma::net_poll`), where
//! Linux retries on a netevent or a timer. On an Ethernet port the
//! GIDs are the IPv4-mapped ones of the two addresses (`rdma_ip2gid`) and
//! the neighbour is the peer's MAC from Ethernet ARP. Left out: IPv6, `AF_IB`
//! addresses, resolution over netlink (`ib_nl_*`), network namespaces and
//! the RoCE v2 resolution by GID attribute (`resolve_by_gid_attr`).

use alloc::string::String;
use alloc::vec::Vec;
use core::net::Ipv4Addr;

use crate::device::{DeviceId, IbCore};
use crate::error::{Error, Result, errno};
use crate::verbs::Gid;

/// Longest hardware address (`MAX_ADDR_LEN`).
pub const MAX_ADDR_LEN: usize = 32;
/// Device type of an Ethernet link (`ARPHRD_ETHER`).
pub const ARPHRD_ETHER: u16 = 1;
/// Device type of an IPoIB link (`ARPHRD_INFINIBAND`).
pub const ARPHRD_INFINIBAND: u16 = 32;

/// A hardware address as `struct rdma_dev_addr` keeps one: up to
/// [`MAX_ADDR_LEN`] bytes, the rest zero.
pub type DevAddrBytes = [u8; MAX_ADDR_LEN];

/// The first [`MAX_ADDR_LEN`] bytes of `b`, zero-padded.
pub fn dev_addr_bytes(b: &[u8]) -> DevAddrBytes {
    let mut a = [0u8; MAX_ADDR_LEN];
    let n = b.len().min(MAX_ADDR_LEN);
    a[..n].copy_from_slice(&b[..n]);
    a
}

/// A network device as the RDMA CM sees it (what `struct net_device` gives
/// `addr.c` and `cma.c`): its index, type, addresses and the RDMA port
/// behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetDev {
    /// Interface index (`ip link`'s number; `bound_dev_if`).
    pub ifindex: u32,
    /// Its name (`ib0`).
    pub name: String,
    /// `ARPHRD_*`.
    pub dev_type: u16,
    /// Its hardware address (IPoIB: flags, QPN, port GID).
    pub dev_addr: DevAddrBytes,
    /// Its broadcast address (IPoIB: the P_Key in bytes 8-9).
    pub broadcast: DevAddrBytes,
    /// IP MTU.
    pub mtu: u32,
    /// Whether its carrier is up.
    pub carrier: bool,
    /// Its IPv4 addresses and prefix lengths.
    pub addrs: Vec<(Ipv4Addr, u8)>,
    /// The RDMA device and port it runs over (an IPoIB port, a RoCE port);
    /// `None` for a link no RDMA port is behind (`lo`).
    pub rdma_port: Option<(DeviceId, u8)>,
}

impl NetDev {
    /// Whether `a` is one of its addresses.
    pub fn has_addr(&self, a: Ipv4Addr) -> bool {
        self.addrs.iter().any(|(x, _)| *x == a)
    }
}

/// Where a packet to an address goes (`ip_route_output_key`'s answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRoute {
    /// The source address the route picks (or the one asked for).
    pub src: Ipv4Addr,
    /// The neighbour to resolve: the destination on a connected network,
    /// else the gateway.
    pub next_hop: Ipv4Addr,
    /// The device it leaves by.
    pub ifindex: u32,
    /// The destination is one of our own addresses (loopback).
    pub local: bool,
}

/// The IP stack, as address resolution needs it: routes, devices and
/// neighbours. Implemented by the owner of the stack; nothing here may
/// block.
pub trait IpNet {
    /// The route to `dst`, from `src` if given (which must then be one of
    /// ours): `-ENETUNREACH` when there is none, `-EADDRNOTAVAIL` for a
    /// source that is not ours.
    fn route(&mut self, src: Option<Ipv4Addr>, dst: Ipv4Addr) -> Result<IpRoute>;
    /// Every device, for `f`.
    fn netdevs(&self, f: &mut dyn FnMut(&NetDev));
    /// The neighbour `ip` on device `ifindex`: its hardware address once
    /// resolved, `None` while resolution goes on. `start` asks for
    /// resolution to begin (or begin again after a failure: an ARP request
    /// goes out); without it, an entry that failed is an error
    /// (`-EHOSTUNREACH`).
    fn neigh(
        &mut self,
        core: &mut IbCore,
        ifindex: u32,
        ip: Ipv4Addr,
        start: bool,
    ) -> Result<Option<DevAddrBytes>>;
    /// One pass of the stack: what it received (ARP replies among it) and
    /// what it has to send.
    fn poll(&mut self, core: &mut IbCore);
}

/// The device of `ifindex`, from `net`.
pub fn netdev(net: &dyn IpNet, ifindex: u32) -> Option<NetDev> {
    let mut found = None;
    net.netdevs(&mut |d| {
        if d.ifindex == ifindex && found.is_none() {
            found = Some(d.clone());
        }
    });
    found
}

/// `struct rdma_dev_addr`: the hardware addresses of both ends, the device
/// type and the device a connection is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaDevAddr {
    /// Our hardware address.
    pub src_dev_addr: DevAddrBytes,
    /// The peer's.
    pub dst_dev_addr: DevAddrBytes,
    /// The device's broadcast address.
    pub broadcast: DevAddrBytes,
    /// `ARPHRD_*`.
    pub dev_type: u16,
    /// The interface index.
    pub bound_dev_if: u32,
    /// The RDMA device and port behind the interface.
    pub rdma_port: Option<(DeviceId, u8)>,
    /// On an Ethernet (RoCE) interface: our GID and the peer's, made from
    /// the two IPv4 addresses (`rdma_ip2gid`, `::ffff:a.b.c.d`); `None` on
    /// IPoIB, whose GIDs are in the hardware addresses.
    pub roce_gids: Option<(Gid, Gid)>,
}

impl RdmaDevAddr {
    /// `ib_addr_get_sgid`: on IPoIB our port GID, bytes 4-19 of our
    /// hardware address; on RoCE the GID of our IPv4 address.
    #[doc(alias = "ib_addr_get_sgid")]
    pub fn sgid(&self) -> Gid {
        match self.roce_gids {
            Some((s, _)) => s,
            None => gid_at(&self.src_dev_addr),
        }
    }
    /// `ib_addr_get_dgid`: the peer's port GID (RoCE: of its IPv4
    /// address).
    #[doc(alias = "ib_addr_get_dgid")]
    pub fn dgid(&self) -> Gid {
        match self.roce_gids {
            Some((_, d)) => d,
            None => gid_at(&self.dst_dev_addr),
        }
    }
    /// `ib_addr_get_pkey`: the P_Key in bytes 8-9 of the broadcast
    /// address (with its full-member bit); on Ethernet the default P_Key
    /// 0xffff (`cma_acquire_dev` for RoCE).
    #[doc(alias = "ib_addr_get_pkey")]
    pub fn pkey(&self) -> u16 {
        if self.dev_type == ARPHRD_ETHER {
            return 0xffff;
        }
        u16::from_be_bytes([self.broadcast[8], self.broadcast[9]])
    }
    /// On an Ethernet interface, the RoCE GIDs of `src` (ours) and `dst`
    /// (the peer's); nothing on IPoIB.
    pub fn set_roce_ips(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        if self.dev_type == ARPHRD_ETHER {
            self.roce_gids = Some((ip2gid(src), ip2gid(dst)));
        }
    }
    /// The peer's QPN in an IPoIB hardware address (bytes 1-3).
    pub fn dst_qpn(&self) -> u32 {
        u32::from_be_bytes([
            0,
            self.dst_dev_addr[1],
            self.dst_dev_addr[2],
            self.dst_dev_addr[3],
        ])
    }
}

/// `rdma_ip2gid` for IPv4: the IPv4-mapped GID `::ffff:a.b.c.d`.
#[doc(alias = "rdma_ip2gid")]
pub fn ip2gid(a: Ipv4Addr) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a.octets());
    Gid(g)
}

fn gid_at(a: &DevAddrBytes) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&a[4..20]);
    Gid(g)
}

/// `rdma_copy_src_l2_addr`: what `dev` gives the address (our hardware
/// address, its broadcast address and type, its index).
#[doc(alias = "rdma_copy_src_l2_addr")]
pub fn copy_src_l2_addr(dev: &NetDev) -> RdmaDevAddr {
    RdmaDevAddr {
        src_dev_addr: dev.dev_addr,
        dst_dev_addr: [0; MAX_ADDR_LEN],
        broadcast: dev.broadcast,
        dev_type: dev.dev_type,
        bound_dev_if: dev.ifindex,
        rdma_port: dev.rdma_port,
        roce_gids: None,
    }
}

/// Whether `a` can be the address of a peer (`validate_ipv4_net_dev`'s
/// refusals: multicast, limited broadcast, zero network, loopback).
pub fn is_unicast(a: Ipv4Addr) -> bool {
    !(a.is_multicast() || a.is_broadcast() || a.octets()[0] == 0 || a.is_loopback())
}

/// One step of `addr_resolve` for IPv4 (`addr4_resolve` and
/// `addr_resolve_neigh`): the route to `dst`, then, unless it is local,
/// the neighbour on the route's device. `Ok(None)` while ARP goes on
/// (Linux's `-ENODATA`); `start` begins resolution (the first step).
/// Returns the source address the route picked with the device address.
pub fn addr_resolve(
    core: &mut IbCore,
    net: &mut dyn IpNet,
    src: Option<Ipv4Addr>,
    dst: Ipv4Addr,
    start: bool,
) -> Result<Option<(Ipv4Addr, RdmaDevAddr)>> {
    if dst.is_unspecified() || dst.is_broadcast() || dst.is_multicast() {
        return Err(Error::Errno(errno::EADDRNOTAVAIL));
    }
    let route = net.route(src, dst)?;
    if route.local {
        // rdma_translate_ip + cma_resolve_loopback: our own address; the
        // peer is the device that owns it.
        let mut owner = None;
        net.netdevs(&mut |d| {
            if owner.is_none() && d.has_addr(dst) && d.rdma_port.is_some() {
                owner = Some(d.clone());
            }
        });
        let d = owner.ok_or(Error::Errno(errno::ENODEV))?;
        let mut a = copy_src_l2_addr(&d);
        a.dst_dev_addr = d.dev_addr;
        let src = if src.is_none_or(|s| s.is_unspecified()) {
            dst
        } else {
            route.src
        };
        a.set_roce_ips(src, dst);
        return Ok(Some((src, a)));
    }
    let d = netdev(net, route.ifindex).ok_or(Error::Errno(errno::ENODEV))?;
    match net.neigh(core, route.ifindex, route.next_hop, start)? {
        Some(hw) => {
            let mut a = copy_src_l2_addr(&d);
            a.dst_dev_addr = hw;
            a.set_roce_ips(route.src, dst);
            Ok(Some((route.src, a)))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_addr_fields_come_from_the_hardware_addresses() {
        let mut hw = [0u8; 20];
        hw[1..4].copy_from_slice(&[0x00, 0x04, 0x48]);
        hw[4..].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0, 0, 0x11]);
        let mut b = [0u8; 20];
        b[..10].copy_from_slice(&[0, 0xff, 0xff, 0xff, 0xff, 0x12, 0x40, 0x1b, 0xff, 0xff]);
        let a = RdmaDevAddr {
            src_dev_addr: dev_addr_bytes(&hw),
            dst_dev_addr: dev_addr_bytes(&hw),
            broadcast: dev_addr_bytes(&b),
            dev_type: ARPHRD_INFINIBAND,
            bound_dev_if: 2,
            rdma_port: None,
            roce_gids: None,
        };
        assert_eq!(a.pkey(), 0xffff);
        assert_eq!(
            a.sgid(),
            Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_0011)
        );
        assert_eq!(a.dgid(), a.sgid());
        assert_eq!(a.dst_qpn(), 0x448);
        let mut e = a;
        e.dev_type = ARPHRD_ETHER;
        e.set_roce_ips(
            Ipv4Addr::new(192, 168, 50, 2),
            Ipv4Addr::new(192, 168, 50, 1),
        );
        assert_eq!(e.sgid(), Gid::new(0, 0xffff_c0a8_3202));
        assert_eq!(e.dgid(), Gid::new(0, 0xffff_c0a8_3201));
        assert_eq!(e.pkey(), 0xffff);
        assert!(is_unicast(Ipv4Addr::new(10, 0, 0, 1)));
        for bad in [[224, 0, 0, 1], [255; 4], [0, 1, 2, 3], [127, 0, 0, 1]] {
            assert!(!is_unicast(Ipv4Addr::from(bad)), "{bad:?}");
        }
    }
}
