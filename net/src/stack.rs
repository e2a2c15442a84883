//! The IP stack: one smoltcp `Interface` per link, with its addresses, the routing table and the sockets, all moved forward by one [`Stack::poll`], in the place of Linux's `net/ipv4` (`devinet.c`, `fib_*.c`) for a host that does not forward.
//!
//! Leaves out: forwarding between links, IPv6, fragmentation and
//! reassembly, multicast groups, and sockets shared between links: a socket
//! lives on the link its route leaves by (smoltcp's `SocketSet` per
//! `Interface`), chosen when it is opened. A packet to one of our own
//! addresses goes through `lo`, as in Linux: `lo`'s interface carries every
//! other link's addresses as /32s.
//!
//! Nothing blocks. [`Stack::poll`] asks each link for what it received (a
//! bounded number of packets per call), runs the echo services, and lets
//! smoltcp send what the sockets have queued; its caller decides when to
//! call it again.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use smoltcp::iface::{
    Config, Interface, PollIngressSingleResult, PollResult, SocketHandle, SocketSet,
};
use smoltcp::phy::{self, DeviceCapabilities};
use smoltcp::socket::{AnySocket, raw, tcp, udp};
use smoltcp::time::Instant;
use smoltcp::wire::{
    EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpProtocol, IpVersion, Ipv4Address,
    Ipv4Cidr,
};

use crate::config::IpConfig;
use crate::device::{ArpView, Counters, Port};
use crate::echo::Echo;
use crate::link::{Link, LinkKind, LinkStats, Neighbour};
use crate::loopback::Loopback;
use crate::route::{Proto, Route, Routes, Table};

/// A link's index, as `ip link` numbers them (`lo` is 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkId(pub u32);

/// An Ethernet link's RDMA side ([`Stack::roce_link`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoceLink {
    /// The owner's handle of the RDMA device ([`Link::rdma_port`]).
    pub dev: u32,
    /// Its port.
    pub port: u8,
    /// The link's VLAN id, for a VLAN device.
    pub vlan: Option<u16>,
}

/// What went wrong, in iproute2's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// No link of that name.
    NoDevice(String),
    /// The address, route or link name is already there.
    Exists,
    /// The address to delete is not there.
    NoAddress,
    /// The route to delete is not there.
    NoRoute,
    /// No route to the destination.
    Unreachable,
    /// The gateway is not on a connected network.
    BadGateway,
    /// smoltcp's fixed tables are full (addresses, routes).
    NoSpace,
    /// An argument that cannot be used.
    Invalid(&'static str),
    /// The link's driver refused, in its own words.
    Refused(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDevice(d) => write!(f, "Cannot find device \"{d}\""),
            Error::Exists => f.write_str("RTNETLINK answers: File exists"),
            Error::NoAddress => f.write_str("RTNETLINK answers: Cannot assign requested address"),
            Error::NoRoute => f.write_str("RTNETLINK answers: No such process"),
            Error::Unreachable => f.write_str("Network is unreachable"),
            Error::BadGateway => f.write_str("Error: Nexthop has invalid gateway."),
            Error::NoSpace => f.write_str("RTNETLINK answers: No space left on device"),
            Error::Invalid(m) => write!(f, "Error: {m}."),
            Error::Refused(m) => f.write_str(m),
        }
    }
}

/// A socket of the stack: the link it lives on and its smoltcp handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketRef {
    /// The link.
    pub dev: LinkId,
    handle: SocketHandle,
}

/// Where a packet to some destination goes (`ip route get`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Egress {
    /// The link that sends it (`lo` for our own addresses).
    pub link: LinkId,
    /// The link of the route (the one holding the address, for ours).
    pub dev: LinkId,
    /// The source address.
    pub src: Ipv4Address,
    /// Where it goes on the link: the destination or a gateway.
    pub next_hop: Ipv4Address,
    /// The sending link's IP MTU.
    pub mtu: usize,
    /// Whether the destination is one of ours.
    pub local: bool,
}

/// How long an ARP request of [`Stack::arp_request`] waits before
/// [`Stack::arp_request_again`] sends another (Linux's `retrans_time`).
const ARP_RETRANS_US: u64 = 1_000_000;

/// Packets taken in, and rounds of sending, in one poll of one link.
const BUDGET: usize = 64;
/// The echo services' copy buffer.
const SCRATCH: usize = 64 * 1024;

pub(crate) struct Iface<C: ?Sized> {
    pub id: LinkId,
    pub name: String,
    pub link: Box<dyn Link<C>>,
    pub kind: LinkKind,
    pub mtu: usize,
    pub carrier: bool,
    pub iface: Interface,
    pub sockets: SocketSet<'static>,
    /// Our addresses on this link, in the order added.
    pub addrs: Vec<Ipv4Cidr>,
    rx_buf: Vec<u8>,
    tx_scratch: Vec<u8>,
    pub counters: Counters,
    pub arp: ArpView,
    /// ARP requests [`Stack::arp_request`] sent: address and when.
    arp_sent: Vec<(Ipv4Address, u64)>,
    echo: Echo,
}

impl<C: ?Sized> Iface<C> {
    /// The link's counters with the stack's drops added.
    pub fn stats(&self) -> LinkStats {
        let mut s = self.link.stats();
        let c = &self.counters;
        s.rx_dropped += c.rx_malformed + c.rx_unsupported;
        s.tx_dropped += c.tx_dropped;
        s.tx_carrier_errors += c.tx_carrier;
        s
    }

    /// The address a packet to `to` leaves this link from: one whose
    /// network holds `to`, else the first.
    fn source_for(&self, to: Ipv4Address) -> Option<Ipv4Address> {
        self.addrs
            .iter()
            .find(|c| c.contains_addr(&to))
            .or(self.addrs.first())
            .map(|c| c.address())
    }

    fn socket<T: AnySocket<'static>>(&mut self, h: SocketHandle) -> Option<&mut T> {
        self.sockets
            .iter_mut()
            .find(|(x, _)| *x == h)
            .and_then(|(_, s)| T::downcast_mut(s))
    }
}

/// A device that only has capabilities: smoltcp reads them when it makes
/// an interface, before any context to poll the link with exists.
struct CapsOnly(DeviceCapabilities);

struct NoToken;

impl phy::RxToken for NoToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&[])
    }
}

impl phy::TxToken for NoToken {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        f(&mut vec![0; len])
    }
}

impl phy::Device for CapsOnly {
    type RxToken<'a> = NoToken;
    type TxToken<'a> = NoToken;
    fn receive(&mut self, _: Instant) -> Option<(NoToken, NoToken)> {
        None
    }
    fn transmit(&mut self, _: Instant) -> Option<NoToken> {
        None
    }
    fn capabilities(&self) -> DeviceCapabilities {
        self.0.clone()
    }
}

/// The IP stack over links that take a poll context `C`.
pub struct Stack<C: ?Sized = ()> {
    pub(crate) ifaces: Vec<Iface<C>>,
    next_index: u32,
    pub(crate) routes: Routes,
    pending: Vec<IpConfig>,
    pub(crate) now_us: u64,
    scratch: Vec<u8>,
}

fn instant(us: u64) -> Instant {
    Instant::from_micros(i64::try_from(us).unwrap_or(i64::MAX))
}

impl<C: ?Sized> Stack<C> {
    /// A stack with `lo` (127.0.0.1/8), at time `now_us` (microseconds
    /// on the caller's clock, which [`poll`](Stack::poll) goes on with).
    pub fn new(now_us: u64) -> Stack<C> {
        let mut s = Stack {
            ifaces: Vec::new(),
            next_index: 1,
            routes: Routes::default(),
            pending: Vec::new(),
            now_us,
            scratch: vec![0; SCRATCH],
        };
        // Neither can fail on an empty stack.
        if let Ok(lo) = s.add_link("lo", Box::new(Loopback::new())) {
            let _ = s.add_addr(lo, Ipv4Cidr::new(Ipv4Address::new(127, 0, 0, 1), 8));
        }
        s
    }

    /// The time of the last poll.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    pub(crate) fn iface(&self, id: LinkId) -> Option<&Iface<C>> {
        self.ifaces.iter().find(|i| i.id == id)
    }

    fn iface_mut(&mut self, id: LinkId) -> Option<&mut Iface<C>> {
        self.ifaces.iter_mut().find(|i| i.id == id)
    }

    fn lo(&self) -> Option<LinkId> {
        self.ifaces
            .iter()
            .find(|i| i.kind == LinkKind::Loopback)
            .map(|i| i.id)
    }

    /// The link named `name`.
    pub fn link_id(&self, name: &str) -> Option<LinkId> {
        self.ifaces.iter().find(|i| i.name == name).map(|i| i.id)
    }

    /// [`link_id`](Stack::link_id), or iproute2's error.
    pub fn dev(&self, name: &str) -> Result<LinkId, Error> {
        self.link_id(name)
            .ok_or_else(|| Error::NoDevice(String::from(name)))
    }

    /// Every link's index and name, in index order.
    pub fn links(&self) -> impl Iterator<Item = (LinkId, &str)> {
        self.ifaces.iter().map(|i| (i.id, i.name.as_str()))
    }

    /// The name of link `id`.
    pub fn link_name(&self, id: LinkId) -> Option<&str> {
        self.iface(id).map(|i| i.name.as_str())
    }

    /// Our addresses on link `id`.
    pub fn addrs(&self, id: LinkId) -> &[Ipv4Cidr] {
        self.iface(id).map_or(&[], |i| &i.addrs)
    }

    /// Link `id`'s counters (the link's, with the stack's drops added).
    pub fn stats(&self, id: LinkId) -> Option<LinkStats> {
        self.iface(id).map(|i| i.stats())
    }

    /// The stack's own counts on link `id`.
    pub fn counters(&self, id: LinkId) -> Option<Counters> {
        self.iface(id).map(|i| i.counters)
    }

    /// Whether link `id` has its carrier, as of the last poll.
    pub fn carrier(&self, id: LinkId) -> bool {
        self.iface(id).is_some_and(|i| i.carrier)
    }

    /// Calls `f` for each neighbour of link `id`: the link's own table, or
    /// for an Ethernet link what the stack saw of smoltcp's ARP.
    pub fn neighbours(&self, id: LinkId, f: &mut dyn FnMut(&Neighbour)) {
        if let Some(i) = self.iface(id) {
            i.link.neighbours(f);
            if i.kind == LinkKind::Ether {
                i.arp.for_each(self.now_us, f);
            }
        }
    }

    /// The RDMA port behind Ethernet link `id` (RoCE) and the link's VLAN:
    /// what a RoCE GID entry is keyed by, as Linux's GID cache keys it by
    /// netdev. `None` for a link of another kind or with no RDMA port.
    pub fn roce_link(&self, id: LinkId) -> Option<RoceLink> {
        let l = self.link(id).filter(|l| l.kind() == LinkKind::Ether)?;
        let (dev, port) = l.rdma_port()?;
        Some(RoceLink {
            dev,
            port,
            vlan: l.vlan().map(|(v, _)| v),
        })
    }

    /// What RoCE follows of link `id`: its IPv4 addresses (the GIDs) into
    /// `addrs` and its neighbours with a MAC into `neigh`, both cleared
    /// first. The caller keeps the two between calls, so a pass that runs
    /// on every poll allocates nothing once they have grown.
    pub fn roce_addrs(
        &self,
        id: LinkId,
        addrs: &mut Vec<[u8; 4]>,
        neigh: &mut Vec<([u8; 4], [u8; 6])>,
    ) {
        addrs.clear();
        addrs.extend(self.addrs(id).iter().map(|c| c.address().octets()));
        neigh.clear();
        self.neighbours(id, &mut |n| {
            if let Some(mac) = n
                .lladdr
                .and_then(|m| <[u8; 6]>::try_from(m.as_bytes()).ok())
            {
                neigh.push((n.addr.octets(), mac));
            }
        });
    }

    /// Sends an ARP request for `ip` on Ethernet link `id` from our address
    /// on the network that holds `ip` (what Linux's `neigh_event_send`
    /// does for `addr.c`): the reply lands in smoltcp's cache and the
    /// stack's view of it ([`Stack::neighbours`]). `Ok(false)` when no
    /// send slot is free now.
    pub fn arp_request(&mut self, id: LinkId, ip: Ipv4Address, ctx: &mut C) -> Result<bool, Error> {
        let now = self.now_us;
        let i = self
            .iface_mut(id)
            .ok_or_else(|| Error::NoDevice(alloc::format!("{}", id.0)))?;
        if i.kind != LinkKind::Ether {
            return Err(Error::Invalid("ARP runs on an Ethernet link"));
        }
        let src = i
            .addrs
            .iter()
            .find(|c| c.contains_addr(&ip))
            .or(i.addrs.first())
            .ok_or(Error::Invalid("no address of ours on the link"))?
            .address();
        let hw = i.link.hw_addr();
        if hw.as_bytes().len() != 6 {
            return Err(Error::Invalid("an Ethernet link without a 6-byte MAC"));
        }
        let mac = EthernetAddress::from_bytes(hw.as_bytes());
        if !i.carrier || !i.link.tx_ready(ctx) {
            return Ok(false);
        }
        // The minimum Ethernet frame (60 bytes before the FCS).
        let Some(b) = i.link.tx_buffer(ctx, 60) else {
            return Ok(false);
        };
        b.fill(0);
        let eth = smoltcp::wire::EthernetRepr {
            src_addr: mac,
            dst_addr: EthernetAddress::BROADCAST,
            ethertype: smoltcp::wire::EthernetProtocol::Arp,
        };
        let mut frame = smoltcp::wire::EthernetFrame::new_unchecked(&mut *b);
        eth.emit(&mut frame);
        smoltcp::wire::ArpRepr::EthernetIpv4 {
            operation: smoltcp::wire::ArpOperation::Request,
            source_hardware_addr: mac,
            source_protocol_addr: src,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: ip,
        }
        .emit(&mut smoltcp::wire::ArpPacket::new_unchecked(
            frame.payload_mut(),
        ));
        i.link.tx_commit(ctx, ip);
        i.arp_sent
            .retain(|e| e.0 != ip && now.saturating_sub(e.1) < ARP_RETRANS_US * 8);
        if i.arp_sent.len() < 16 {
            i.arp_sent.push((ip, now));
        }
        Ok(true)
    }

    /// [`Stack::arp_request`] again for `ip` if the last request for it
    /// went out at least a second ago (Linux's `retrans_time`), or never.
    pub fn arp_request_again(
        &mut self,
        id: LinkId,
        ip: Ipv4Address,
        ctx: &mut C,
    ) -> Result<bool, Error> {
        let now = self.now_us;
        let recent = self.iface(id).is_some_and(|i| {
            i.arp_sent
                .iter()
                .any(|e| e.0 == ip && now.saturating_sub(e.1) < ARP_RETRANS_US)
        });
        if recent {
            return Ok(false);
        }
        self.arp_request(id, ip, ctx)
    }

    /// Link `id` itself (its driver reached through
    /// [`Link::as_any`]).
    pub fn link(&self, id: LinkId) -> Option<&dyn Link<C>> {
        self.iface(id).map(|i| &*i.link)
    }

    /// Link `id` itself, mutable.
    pub fn link_mut(&mut self, id: LinkId) -> Option<&mut (dyn Link<C> + 'static)> {
        self.iface_mut(id).map(|i| &mut *i.link)
    }

    /// Every route, both tables.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter()
    }

    /// Registers a link as `name` (`ib0`, `eth0`): it gets the next index,
    /// an interface, the echo services, and the command-line addresses
    /// waiting for that name (or for the first link, if it is the first
    /// other than `lo`).
    pub fn add_link(&mut self, name: &str, link: Box<dyn Link<C>>) -> Result<LinkId, Error> {
        self.check_new_name(name)?;
        let kind = link.kind();
        let mtu = link.mtu();
        if !(68..=65536).contains(&mtu) {
            return Err(Error::Invalid("a link's MTU is 68 to 65536"));
        }
        let hw = match kind {
            LinkKind::Ether => {
                let b = link.hw_addr();
                let mac = match b.as_bytes().try_into() {
                    Ok(m) => EthernetAddress(m),
                    Err(_) => return Err(Error::Invalid("an Ethernet address is 6 bytes")),
                };
                if !mac.is_unicast() {
                    return Err(Error::Invalid("an Ethernet link needs a unicast address"));
                }
                HardwareAddress::Ethernet(mac)
            }
            _ => HardwareAddress::Ip,
        };
        let mut caps = DeviceCapabilities::default();
        caps.medium = kind.medium();
        caps.max_transmission_unit = mtu.min(65535) + kind.header_len();
        let mut config = Config::new(hw);
        config.random_seed = self.now_us ^ u64::from(self.next_index) << 32;
        let mut iface = Interface::new(config, &mut CapsOnly(caps), instant(self.now_us));
        iface.set_any_ip(kind == LinkKind::Loopback);
        let mut sockets = SocketSet::new(Vec::new());
        let echo = Echo::open(&mut sockets);
        let id = LinkId(self.next_index);
        self.next_index += 1;
        let carrier = link.carrier();
        self.ifaces.push(Iface {
            id,
            name: String::from(name),
            link,
            kind,
            mtu,
            carrier,
            iface,
            sockets,
            addrs: Vec::new(),
            rx_buf: vec![0; mtu + kind.header_len()],
            tx_scratch: vec![0; mtu + kind.header_len()],
            counters: Counters::default(),
            arp: ArpView::default(),
            arp_sent: Vec::new(),
            echo,
        });
        // Addresses of other links, for lo to take in.
        if kind == LinkKind::Loopback {
            let others: Vec<Ipv4Address> = self
                .ifaces
                .iter()
                .filter(|i| i.id != id)
                .flat_map(|i| i.addrs.iter().map(|c| c.address()))
                .collect();
            for a in others {
                self.mirror(a, true);
            }
        }
        // Command-line addresses for it.
        let first = kind != LinkKind::Loopback
            && !self
                .ifaces
                .iter()
                .any(|i| i.id != id && i.kind != LinkKind::Loopback);
        let mine: Vec<IpConfig> = self
            .pending
            .iter()
            .filter(|c| c.dev.as_deref().map_or(first, |d| d == name))
            .cloned()
            .collect();
        self.pending
            .retain(|c| !c.dev.as_deref().map_or(first, |d| d == name));
        for c in mine {
            self.apply(id, &c);
        }
        Ok(id)
    }

    /// Whether `name` can be a new link's.
    fn check_new_name(&self, name: &str) -> Result<(), Error> {
        if name.is_empty() || name.len() > 15 || name.contains([' ', '/', ':', '@']) {
            return Err(Error::Invalid(
                "link names are 1 to 15 characters, no space, /, : or @",
            ));
        }
        if self.link_id(name).is_some() {
            return Err(Error::Exists);
        }
        Ok(())
    }

    /// `ip link add link LOWER name NAME type vlan id VID`: a VLAN device
    /// over link `lower` (its driver makes it), registered as `name`.
    pub fn add_vlan(
        &mut self,
        lower: LinkId,
        name: &str,
        vid: u16,
        ctx: &mut C,
    ) -> Result<LinkId, Error> {
        self.check_new_name(name)?;
        if !(1..=4094).contains(&vid) {
            return Err(Error::Invalid("8021q: Invalid VLAN id"));
        }
        let i = self
            .iface(lower)
            .ok_or_else(|| Error::NoDevice(alloc::format!("{}", lower.0)))?;
        let lower_name = i.name.clone();
        if self
            .ifaces
            .iter()
            .any(|i| i.link.vlan() == Some((vid, lower_name.as_str())))
        {
            return Err(Error::Exists);
        }
        let i = self
            .iface_mut(lower)
            .ok_or_else(|| Error::NoDevice(lower_name.clone()))?;
        let link = i
            .link
            .add_vlan(ctx, vid, &lower_name)
            .map_err(Error::Refused)?;
        self.add_link(name, link)
    }

    /// `ip link delete NAME`: takes out a link made by [`Stack::add_vlan`]
    /// (as [`Stack::remove_link`]) and lets it give back what it holds in
    /// the hardware. Other links are the hardware's own and stay.
    pub fn delete_link(&mut self, id: LinkId, ctx: &mut C) -> Result<(), Error> {
        let i = self
            .iface(id)
            .ok_or_else(|| Error::NoDevice(alloc::format!("{}", id.0)))?;
        if i.link.vlan().is_none() {
            return Err(Error::Refused(String::from(
                "RTNETLINK answers: Operation not supported",
            )));
        }
        if let Some(mut l) = self.remove_link(id) {
            l.detach(ctx);
        }
        Ok(())
    }

    /// Takes link `id` out (not `lo`): its addresses and routes go, its
    /// sockets close, and the link is handed back.
    pub fn remove_link(&mut self, id: LinkId) -> Option<Box<dyn Link<C>>> {
        let pos = self
            .ifaces
            .iter()
            .position(|i| i.id == id && i.kind != LinkKind::Loopback)?;
        let i = self.ifaces.remove(pos);
        for c in &i.addrs {
            self.mirror(c.address(), false);
        }
        self.routes.remove_where(|r| r.dev == id);
        Some(i.link)
    }

    /// Adds (or, with `add` false, removes) `a` as a /32 on lo's
    /// interface, so that lo takes packets to it; never lo's own.
    fn mirror(&mut self, a: Ipv4Address, add: bool) {
        let Some(lo) = self.lo() else {
            return;
        };
        let held_elsewhere = self
            .ifaces
            .iter()
            .filter(|i| i.id != lo)
            .any(|i| i.addrs.iter().any(|c| c.address() == a));
        let Some(l) = self.iface_mut(lo) else {
            return;
        };
        if l.addrs.iter().any(|c| c.address() == a) {
            return;
        }
        let mut full = false;
        l.iface.update_ip_addrs(|v| {
            let cidr = IpCidr::Ipv4(Ipv4Cidr::new(a, 32));
            if add {
                if !v.contains(&cidr) {
                    full = v.push(cidr).is_err();
                }
            } else if !held_elsewhere {
                v.retain(|c| *c != cidr);
            }
        });
        if full {
            log::warn!("lo: no room for {a}: packets to it will not come back to us");
        }
    }

    /// Adds `addr` to link `id` (`ip addr add`), with its connected and
    /// local routes.
    pub fn add_addr(&mut self, id: LinkId, addr: Ipv4Cidr) -> Result<(), Error> {
        let a = addr.address();
        if a.is_unspecified() || a.is_broadcast() || a.is_multicast() {
            return Err(Error::Invalid("an address of a link is unicast"));
        }
        let i = self
            .iface_mut(id)
            .ok_or_else(|| Error::NoDevice(alloc::format!("{}", id.0)))?;
        if i.addrs.iter().any(|c| c.address() == a) {
            return Err(Error::Exists);
        }
        let mut full = false;
        i.iface
            .update_ip_addrs(|v| full = v.push(IpCidr::Ipv4(addr)).is_err());
        if full {
            return Err(Error::NoSpace);
        }
        i.addrs.push(addr);
        i.link.addrs_changed(&i.addrs);
        let lo = i.kind == LinkKind::Loopback;
        let route = |dst, table| Route {
            dst,
            via: None,
            dev: id,
            proto: Proto::Kernel,
            src: Some(a),
            table,
        };
        self.routes.add(route(Ipv4Cidr::new(a, 32), Table::Local));
        if lo {
            self.routes.add(route(addr, Table::Local));
            self.sync_smoltcp_routes(id);
        } else {
            if addr.prefix_len() < 32 {
                self.routes.add(route(addr, Table::Main));
            }
            self.mirror(a, true);
        }
        Ok(())
    }

    /// Removes an address from link `id` (`ip addr del`): `addr` with its
    /// prefix length, or with /32 the address whatever its length (as
    /// iproute2's wildcard deletion). Its routes go with it, and so do the
    /// gateway routes on the link that no connected network reaches any
    /// more.
    pub fn del_addr(&mut self, id: LinkId, addr: Ipv4Cidr) -> Result<(), Error> {
        let i = self
            .iface_mut(id)
            .ok_or_else(|| Error::NoDevice(alloc::format!("{}", id.0)))?;
        let pos = i
            .addrs
            .iter()
            .position(|c| {
                c.address() == addr.address()
                    && (addr.prefix_len() == 32 || c.prefix_len() == addr.prefix_len())
            })
            .ok_or(Error::NoAddress)?;
        let gone = i.addrs.remove(pos);
        i.link.addrs_changed(&i.addrs);
        i.iface
            .update_ip_addrs(|v| v.retain(|c| *c != IpCidr::Ipv4(gone)));
        let nets: Vec<Ipv4Cidr> = i.addrs.clone();
        let lo = i.kind == LinkKind::Loopback;
        let a = gone.address();
        let net = gone.network();
        self.routes.remove_where(|r| {
            r.dev == id
                && ((r.table == Table::Local
                    && (r.dst == Ipv4Cidr::new(a, 32) || r.src == Some(a)))
                    || (r.table == Table::Main
                        && r.via.is_none()
                        && r.dst == net
                        && !nets.iter().any(|c| c.network() == net))
                    || r.via
                        .is_some_and(|g| !nets.iter().any(|c| c.contains_addr(&g))))
        });
        self.sync_smoltcp_routes(id);
        if !lo {
            self.mirror(a, false);
        }
        Ok(())
    }

    /// Adds a route (`ip route add DST [via GW] [dev IF]`). A gateway must
    /// sit on a connected network (of `dev`, if named); without one, `dev`
    /// is needed.
    pub fn add_route(
        &mut self,
        dst: Ipv4Cidr,
        via: Option<Ipv4Address>,
        dev: Option<LinkId>,
        proto: Proto,
    ) -> Result<(), Error> {
        let dev = match (via, dev) {
            (Some(g), d) => {
                let on = |i: &Iface<C>| {
                    i.kind != LinkKind::Loopback && i.addrs.iter().any(|c| c.contains_addr(&g))
                };
                match d {
                    Some(d) => {
                        let i = self
                            .iface(d)
                            .ok_or(Error::NoDevice(alloc::format!("{}", d.0)))?;
                        if !on(i) {
                            return Err(Error::BadGateway);
                        }
                        d
                    }
                    None => self
                        .ifaces
                        .iter()
                        .find(|i| on(i))
                        .map(|i| i.id)
                        .ok_or(Error::BadGateway)?,
                }
            }
            (None, Some(d)) => {
                self.iface(d)
                    .ok_or(Error::NoDevice(alloc::format!("{}", d.0)))?;
                d
            }
            (None, None) => return Err(Error::Invalid("a route needs a gateway or a device")),
        };
        let src = via.and_then(|g| self.iface(dev).and_then(|i| i.source_for(g)));
        let r = Route {
            dst,
            via,
            dev,
            proto,
            src: if via.is_some() { None } else { src },
            table: Table::Main,
        };
        if !self.routes.add(r) {
            return Err(Error::Exists);
        }
        if !self.sync_smoltcp_routes(dev) {
            self.routes
                .remove_where(|x| x.table == Table::Main && x.dst == dst.network() && x.dev == dev);
            self.sync_smoltcp_routes(dev);
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// Removes the first route to `dst` (`ip route del`), narrowed by
    /// gateway and link when given.
    pub fn del_route(
        &mut self,
        dst: Ipv4Cidr,
        via: Option<Ipv4Address>,
        dev: Option<LinkId>,
    ) -> Result<(), Error> {
        let r = *self
            .routes
            .iter()
            .find(|r| {
                r.table == Table::Main
                    && r.dst == dst.network()
                    && via.is_none_or(|g| r.via == Some(g))
                    && dev.is_none_or(|d| r.dev == d)
            })
            .ok_or(Error::NoRoute)?;
        let mut first = true;
        self.routes.remove_where(|x| {
            let hit = first && *x == r;
            first &= !hit;
            hit
        });
        self.sync_smoltcp_routes(r.dev);
        Ok(())
    }

    /// Gives smoltcp's interface of `dev` the gateway routes leaving by it
    /// (an Ethernet link resolves the gateway with them). False if they do
    /// not fit.
    fn sync_smoltcp_routes(&mut self, dev: LinkId) -> bool {
        let mut gws: Vec<(Ipv4Cidr, Ipv4Address)> = self
            .routes
            .iter()
            .filter(|r| r.dev == dev && r.table == Table::Main)
            .filter_map(|r| r.via.map(|g| (r.dst, g)))
            .collect();
        let Some(i) = self.iface_mut(dev) else {
            return true;
        };
        if i.kind == LinkKind::Loopback {
            // lo takes its whole networks (127.0.0.0/8), as Linux's does:
            // smoltcp's any-IP mode accepts what routes through one of
            // its addresses.
            gws.extend(
                i.addrs
                    .iter()
                    .filter(|c| c.prefix_len() < 32)
                    .map(|c| (c.network(), c.address())),
            );
        }
        let mut ok = true;
        i.iface.routes_mut().update(|v| {
            v.clear();
            for (dst, g) in gws {
                let r = smoltcp::iface::Route {
                    cidr: IpCidr::Ipv4(dst),
                    via_router: IpAddress::Ipv4(g),
                    preferred_until: None,
                    expires_at: None,
                };
                ok &= v.push(r).is_ok();
            }
        });
        ok
    }

    /// Where a packet to `dst` goes (`ip route get`), or why it cannot.
    pub fn route_get(&self, dst: Ipv4Address) -> Result<Egress, Error> {
        let r = self.routes.lookup(dst).ok_or(Error::Unreachable)?;
        let local = r.table == Table::Local;
        let link = if local {
            self.lo().ok_or(Error::Unreachable)?
        } else {
            r.dev
        };
        let next_hop = r.via.unwrap_or(dst);
        let src = match (local, r.src) {
            (true, _)
                if self
                    .ifaces
                    .iter()
                    .any(|i| i.addrs.iter().any(|c| c.address() == dst)) =>
            {
                dst
            }
            (_, Some(s)) => s,
            _ => self
                .iface(r.dev)
                .and_then(|i| i.source_for(next_hop))
                .ok_or(Error::Unreachable)?,
        };
        let mtu = self.iface(link).map(|i| i.mtu).ok_or(Error::Unreachable)?;
        Ok(Egress {
            link,
            dev: r.dev,
            src,
            next_hop,
            mtu,
            local,
        })
    }

    /// Applies a command-line address now, or keeps it until its link
    /// appears.
    pub fn configure(&mut self, c: IpConfig) {
        let id = match &c.dev {
            Some(d) => self.link_id(d),
            None => self
                .ifaces
                .iter()
                .find(|i| i.kind != LinkKind::Loopback)
                .map(|i| i.id),
        };
        match id {
            Some(id) => self.apply(id, &c),
            None => self.pending.push(c),
        }
    }

    /// Command-line addresses still waiting for their link.
    pub fn pending(&self) -> &[IpConfig] {
        &self.pending
    }

    fn apply(&mut self, id: LinkId, c: &IpConfig) {
        let name = self.link_name(id).map(String::from).unwrap_or_default();
        match self.add_addr(id, c.addr) {
            Ok(()) => log::info!("{name}: {} from the kernel command line", c.addr),
            Err(e) => log::warn!("{name}: ip={}: {e}", c.addr),
        }
        if let Some(g) = c.gateway {
            let default = Ipv4Cidr::new(Ipv4Address::UNSPECIFIED, 0);
            match self.add_route(default, Some(g), Some(id), Proto::Boot) {
                Ok(()) => log::info!("{name}: default route via {g} from the kernel command line"),
                Err(e) => log::warn!("{name}: ip=: default via {g}: {e}"),
            }
        }
    }

    /// Moves everything forward at `now_us` (the caller's clock, in
    /// microseconds, never going back): each link's housekeeping, up to
    /// [`BUDGET`] received packets per link, the echo services, and what
    /// the sockets have to send. Returns whether anything happened.
    pub fn poll(&mut self, now_us: u64, ctx: &mut C) -> bool {
        self.now_us = self.now_us.max(now_us);
        let now = instant(self.now_us);
        let Stack {
            ifaces,
            routes,
            scratch,
            now_us,
            ..
        } = self;
        let mut busy = false;
        for i in ifaces.iter_mut() {
            i.link.poll(ctx, *now_us);
            let carrier = i.link.carrier();
            if carrier != i.carrier {
                i.carrier = carrier;
                if carrier {
                    log::info!("{}: link becomes ready", i.name);
                } else {
                    log::info!("{}: carrier lost", i.name);
                }
            }
            let mut port = Port {
                link: &mut *i.link,
                ctx: &mut *ctx,
                id: i.id,
                kind: i.kind,
                mtu: i.mtu,
                carrier,
                addrs: &i.addrs,
                routes,
                rx_buf: &mut i.rx_buf,
                tx_scratch: &mut i.tx_scratch,
                counters: &mut i.counters,
                arp: &mut i.arp,
                now_us: *now_us,
            };
            // Loopback twice: what it sent in the first round comes back
            // in the second, so a local round trip takes one poll.
            let rounds = if i.kind == LinkKind::Loopback { 2 } else { 1 };
            for _ in 0..rounds {
                for _ in 0..BUDGET {
                    match i.iface.poll_ingress_single(now, &mut port, &mut i.sockets) {
                        PollIngressSingleResult::None => break,
                        _ => busy = true,
                    }
                }
                i.echo.run(&mut i.sockets, scratch);
                for _ in 0..BUDGET {
                    match i.iface.poll_egress(now, &mut port, &mut i.sockets) {
                        PollResult::None => break,
                        PollResult::SocketStateChanged => busy = true,
                    }
                }
            }
            i.iface.poll_maintenance(now);
        }
        busy
    }

    fn add_socket<T: AnySocket<'static>>(&mut self, dev: LinkId, s: T) -> Result<SocketRef, Error> {
        let i = self
            .iface_mut(dev)
            .ok_or_else(|| Error::NoDevice(alloc::format!("{}", dev.0)))?;
        Ok(SocketRef {
            dev,
            handle: i.sockets.add(s),
        })
    }

    /// A raw ICMP socket on link `dev` (ping's: it sends whole IPv4
    /// packets and receives every ICMP packet the link takes in, header
    /// and all), with room for `packets` packets of `bytes` bytes in all
    /// each way.
    pub fn raw_icmp_open(
        &mut self,
        dev: LinkId,
        packets: usize,
        bytes: usize,
    ) -> Result<SocketRef, Error> {
        let buf =
            || raw::PacketBuffer::new(vec![raw::PacketMetadata::EMPTY; packets], vec![0; bytes]);
        let s = raw::Socket::new(Some(IpVersion::Ipv4), Some(IpProtocol::Icmp), buf(), buf());
        self.add_socket(dev, s)
    }

    /// A UDP socket bound to `port` on link `dev` (0: a free port of
    /// smoltcp's choosing is not offered; pick one), with room for
    /// `packets` datagrams of `bytes` bytes in all each way.
    pub fn udp_open(
        &mut self,
        dev: LinkId,
        port: u16,
        packets: usize,
        bytes: usize,
    ) -> Result<SocketRef, Error> {
        let buf =
            || udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; packets], vec![0; bytes]);
        let mut s = udp::Socket::new(buf(), buf());
        s.bind(port)
            .map_err(|_| Error::Invalid("cannot bind that port"))?;
        self.add_socket(dev, s)
    }

    /// A TCP connection to `dst`:`port` from local port `local_port`, on
    /// the link its route leaves by, with `buf` bytes of buffer each way.
    pub fn tcp_connect(
        &mut self,
        dst: Ipv4Address,
        port: u16,
        local_port: u16,
        buf: usize,
    ) -> Result<SocketRef, Error> {
        let e = self.route_get(dst)?;
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; buf]),
            tcp::SocketBuffer::new(vec![0; buf]),
        );
        let i = self.iface_mut(e.link).ok_or(Error::Unreachable)?;
        s.connect(
            i.iface.context(),
            (IpAddress::Ipv4(dst), port),
            (IpAddress::Ipv4(e.src), local_port),
        )
        .map_err(|_| Error::Invalid("cannot connect from that port"))?;
        self.add_socket(e.link, s)
    }

    /// A TCP socket listening on `port` on link `dev`.
    pub fn tcp_listen(&mut self, dev: LinkId, port: u16, buf: usize) -> Result<SocketRef, Error> {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; buf]),
            tcp::SocketBuffer::new(vec![0; buf]),
        );
        s.listen(port)
            .map_err(|_| Error::Invalid("cannot listen on that port"))?;
        self.add_socket(dev, s)
    }

    /// The TCP socket `s`, if it is one and still open.
    pub fn tcp(&mut self, s: SocketRef) -> Option<&mut tcp::Socket<'static>> {
        self.iface_mut(s.dev)?.socket(s.handle)
    }

    /// The UDP socket `s`.
    pub fn udp(&mut self, s: SocketRef) -> Option<&mut udp::Socket<'static>> {
        self.iface_mut(s.dev)?.socket(s.handle)
    }

    /// The raw socket `s`.
    pub fn raw(&mut self, s: SocketRef) -> Option<&mut raw::Socket<'static>> {
        self.iface_mut(s.dev)?.socket(s.handle)
    }

    /// Drops socket `s` (a TCP connection is aborted: close it first and
    /// poll until it is closed for a clean end). `s` must not be used
    /// again.
    pub fn close(&mut self, s: SocketRef) {
        if let Some(i) = self.iface_mut(s.dev)
            && i.sockets.iter().any(|(h, _)| h == s.handle)
        {
            i.sockets.remove(s.handle);
        }
    }
}
