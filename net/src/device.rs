//! The smoltcp device over a [`Link`]: what Linux's `dev_queue_xmit` and `netif_receive_skb` do between the IP layer and a driver, without queues.
//!
//! Leaves out: queueing (a link without a free send slot makes smoltcp keep
//! its packets), GRO/GSO and offloads. A received packet is copied once,
//! from the link into the interface's receive buffer, and checked
//! ([`crate::check`]) before smoltcp sees it; a packet to send is written by
//! smoltcp straight into the link's buffer, and the next hop for it is
//! looked up in the routing table before the link is told to send it.

use alloc::vec;
use alloc::vec::Vec;

use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities};
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, EthernetFrame, EthernetProtocol, Ipv4Address, Ipv4Cidr};

use crate::LinkId;
use crate::check::{self, Accepted, Drop};
use crate::link::{HwAddr, Link, LinkKind, NeighState, Neighbour};
use crate::route::Routes;

/// What the stack counts on a link beside the link's own counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Received packets dropped as malformed (bad length, header, checksum).
    pub rx_malformed: u64,
    /// Received packets dropped as unsupported (IPv6, fragments, other
    /// EtherTypes).
    pub rx_unsupported: u64,
    /// Packets not sent because the link had no buffer for them.
    pub tx_dropped: u64,
    /// Packets not sent because the link had no carrier.
    pub tx_carrier: u64,
}

/// A received packet was skipped as bad at most this many times in one
/// receive call, so that a flood of garbage cannot hold the poll.
const RX_SKIP_MAX: usize = 32;

/// How long an ARP entry seen on an Ethernet link shows as REACHABLE, and
/// then as STALE until smoltcp's own cache lets it go (60 s).
const ARP_REACHABLE_US: u64 = 30_000_000;
const ARP_LIFETIME_US: u64 = 60_000_000;
const ARP_ENTRIES: usize = 16;

/// An Ethernet link's neighbours as the stack saw them go by (smoltcp keeps
/// its ARP cache to itself): senders of ARP packets aimed at us, refreshed
/// by their IP traffic, as smoltcp fills and refreshes its cache.
#[derive(Default)]
pub struct ArpView {
    entries: Vec<(Ipv4Address, EthernetAddress, u64)>,
}

impl ArpView {
    fn saw(&mut self, ip: Ipv4Address, mac: EthernetAddress, now_us: u64, create: bool) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == ip) {
            if create || e.1 == mac {
                *e = (ip, mac, now_us);
            }
            return;
        }
        if !create {
            return;
        }
        if self.entries.len() == ARP_ENTRIES {
            // The oldest goes.
            if let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].2) {
                self.entries.swap_remove(i);
            }
        }
        self.entries.push((ip, mac, now_us));
    }

    /// Calls `f` for each entry still alive at `now_us`.
    pub fn for_each(&self, now_us: u64, f: &mut dyn FnMut(&Neighbour)) {
        for &(addr, mac, at) in &self.entries {
            let age = now_us.saturating_sub(at);
            if age >= ARP_LIFETIME_US {
                continue;
            }
            f(&Neighbour {
                addr,
                lladdr: Some(HwAddr::new(mac.as_bytes())),
                state: if age < ARP_REACHABLE_US {
                    NeighState::Reachable
                } else {
                    NeighState::Stale
                },
            });
        }
    }
}

/// The receive checksums were checked by [`check`]; smoltcp only computes
/// the ones it sends.
fn checksums() -> ChecksumCapabilities {
    let mut c = ChecksumCapabilities::default();
    c.ipv4 = Checksum::Tx;
    c.udp = Checksum::Tx;
    c.tcp = Checksum::Tx;
    c.icmpv4 = Checksum::Tx;
    c
}

/// One link, lent to smoltcp for one poll.
pub struct Port<'p, C: ?Sized> {
    pub link: &'p mut dyn Link<C>,
    pub ctx: &'p mut C,
    pub id: LinkId,
    pub kind: LinkKind,
    pub mtu: usize,
    pub carrier: bool,
    pub addrs: &'p [Ipv4Cidr],
    pub routes: &'p Routes,
    pub rx_buf: &'p mut [u8],
    pub tx_scratch: &'p mut [u8],
    pub counters: &'p mut Counters,
    pub arp: &'p mut ArpView,
    pub now_us: u64,
}

impl<C: ?Sized> Port<'_, C> {
    /// The Ethernet side of a received frame: ARP aimed at us fills the
    /// view; IP traffic refreshes what is there.
    fn note_ethernet(&mut self, n: usize, a: Accepted) {
        match a {
            Accepted::Arp {
                ip, mac, target, ..
            } => {
                if self.addrs.iter().any(|c| c.address() == target)
                    && self.addrs.iter().any(|c| c.contains_addr(&ip))
                {
                    self.arp.saw(ip, mac, self.now_us, true);
                }
            }
            Accepted::Ipv4 => {
                let f = EthernetFrame::new_unchecked(&self.rx_buf[..n]);
                let p = f.payload();
                if f.ethertype() == EthernetProtocol::Ipv4 && p.len() >= 20 {
                    let src = Ipv4Address::new(p[12], p[13], p[14], p[15]);
                    self.arp.saw(src, f.src_addr(), self.now_us, false);
                }
            }
        }
    }
}

/// A received packet, already in the interface's buffer.
pub struct Rx<'a> {
    buf: &'a [u8],
}

impl phy::RxToken for Rx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.buf)
    }
}

/// The right to send one packet.
pub struct Tx<'a, C: ?Sized> {
    link: &'a mut dyn Link<C>,
    ctx: &'a mut C,
    id: LinkId,
    kind: LinkKind,
    carrier: bool,
    routes: &'a Routes,
    scratch: &'a mut [u8],
    counters: &'a mut Counters,
}

impl<C: ?Sized> Tx<'_, C> {
    /// A packet nobody will send still has to be written somewhere.
    fn discard<R>(scratch: &mut [u8], len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match scratch.get_mut(..len) {
            Some(b) => f(b),
            None => f(&mut vec![0; len]),
        }
    }
}

impl<C: ?Sized> phy::TxToken for Tx<'_, C> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        if !self.carrier {
            self.counters.tx_carrier += 1;
            return Self::discard(self.scratch, len, f);
        }
        let buf = match self.link.tx_buffer(self.ctx, len) {
            Some(b) if b.len() >= len => &mut b[..len],
            _ => {
                self.counters.tx_dropped += 1;
                return Self::discard(self.scratch, len, f);
            }
        };
        let r = f(&mut buf[..]);
        // The destination, for the next hop.
        let ip = match self.kind {
            LinkKind::Ether if buf.get(12..14) == Some(&[0x08, 0x00]) => buf.get(14..),
            LinkKind::Ether => None,
            _ => Some(&buf[..]),
        };
        let next_hop = match ip.and_then(|p| p.get(16..20)) {
            Some(d) => self
                .routes
                .next_hop(self.id, Ipv4Address::new(d[0], d[1], d[2], d[3])),
            None => Ipv4Address::UNSPECIFIED,
        };
        self.link.tx_commit(self.ctx, next_hop);
        r
    }
}

impl<'p, C: ?Sized> phy::Device for Port<'p, C> {
    type RxToken<'a>
        = Rx<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = Tx<'a, C>
    where
        Self: 'a;

    fn receive(&mut self, _timestamp: Instant) -> Option<(Rx<'_>, Tx<'_, C>)> {
        let mut n = 0;
        let mut accepted = None;
        for _ in 0..RX_SKIP_MAX {
            n = self
                .link
                .receive(self.ctx, self.rx_buf)?
                .min(self.rx_buf.len());
            match check::received(self.kind, &self.rx_buf[..n]) {
                Ok(a) => {
                    accepted = Some(a);
                    break;
                }
                Err(Drop::Malformed) => self.counters.rx_malformed += 1,
                Err(Drop::Unsupported) => self.counters.rx_unsupported += 1,
            }
        }
        let a = accepted?;
        if self.kind == LinkKind::Ether {
            self.note_ethernet(n, a);
        }
        Some((
            Rx {
                buf: &self.rx_buf[..n],
            },
            Tx {
                link: &mut *self.link,
                ctx: &mut *self.ctx,
                id: self.id,
                kind: self.kind,
                carrier: self.carrier,
                routes: self.routes,
                scratch: &mut *self.tx_scratch,
                counters: &mut *self.counters,
            },
        ))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<Tx<'_, C>> {
        if self.carrier && !self.link.tx_ready(self.ctx) {
            return None;
        }
        Some(Tx {
            link: &mut *self.link,
            ctx: &mut *self.ctx,
            id: self.id,
            kind: self.kind,
            carrier: self.carrier,
            routes: self.routes,
            scratch: &mut *self.tx_scratch,
            counters: &mut *self.counters,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = self.kind.medium();
        // No IPv4 packet is longer than 65535 bytes, whatever lo's MTU says.
        c.max_transmission_unit = self.mtu.min(65535) + self.kind.header_len();
        c.max_burst_size = None;
        c.checksum = checksums();
        c
    }
}
