//! Two links joined back to back in memory, what Linux's `veth` pair is: each one's sends are the other's receives.
//!
//! For tests of the stack without a driver: two [`Stack`](crate::Stack)s
//! over a pair ping each other, echo through TCP and UDP, and see a lost
//! peer time out. Either medium: an Ethernet pair (smoltcp does ARP over
//! it) or an IP pair; an IP pair of kind [`LinkKind::Infiniband`] has
//! 20-byte addresses and a neighbour table learnt from what it receives,
//! the way an IPoIB link shows its own below the trait. The [`Wire`]
//! handle pulls the carrier, cuts the cable (packets vanish, carrier
//! stays: a peer that went away), drops chosen packets and injects
//! arbitrary bytes. Packets wait in preallocated rings.

use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;

use smoltcp::storage::{PacketBuffer, PacketMetadata};

use crate::link::{HwAddr, Ipv4Address, Link, LinkKind, LinkStats, NeighState, Neighbour};

/// Packets that may wait in each direction.
const SLOTS: usize = 64;

struct Shared {
    /// `queue[i]`: what end `i` receives.
    queue: [PacketBuffer<'static, ()>; 2],
    carrier: bool,
    cut: bool,
    /// Packets still to drop, then let through (each direction).
    drop_next: [u32; 2],
}

/// The cable: what a test does to it.
#[derive(Clone)]
pub struct Wire {
    shared: Arc<spin::Mutex<Shared>>,
}

impl Wire {
    /// Plugs or pulls the cable: both ends see the carrier.
    pub fn set_carrier(&self, up: bool) {
        self.shared.lock().carrier = up;
    }

    /// Cuts (true) or mends the cable: while cut, packets vanish but
    /// both ends keep their carrier, as with a peer that went away.
    pub fn cut(&self, cut: bool) {
        self.shared.lock().cut = cut;
    }

    /// Drops the next `n` packets sent toward end `to` (0 or 1).
    pub fn drop_next(&self, to: usize, n: u32) {
        if let Some(d) = self.shared.lock().drop_next.get_mut(to) {
            *d = n;
        }
    }

    /// Puts `bytes` in front of end `to` as if its peer had sent them;
    /// false if that side's queue is full or `to` is not 0 or 1.
    pub fn inject(&self, to: usize, bytes: &[u8]) -> bool {
        let mut s = self.shared.lock();
        match s.queue.get_mut(to).map(|q| q.enqueue(bytes.len(), ())) {
            Some(Ok(b)) => {
                b.copy_from_slice(bytes);
                true
            }
            _ => false,
        }
    }
}

/// One end of the cable.
pub struct WireEnd {
    side: usize,
    kind: LinkKind,
    mtu: usize,
    hw: HwAddr,
    peer_hw: HwAddr,
    shared: Arc<spin::Mutex<Shared>>,
    stage: Vec<u8>,
    staged: usize,
    stats: LinkStats,
    /// Addresses the peer sent from (an IP pair's neighbour table).
    seen: Vec<Ipv4Address>,
}

/// The hardware address of end `side` of a pair of kind `kind`.
fn hw(kind: LinkKind, side: usize) -> HwAddr {
    let n = side as u8 + 1;
    match kind {
        LinkKind::Ether => HwAddr::new(&[0x02, 0, 0, 0, 0, n]),
        // Flags 0, QPN 0x48 + n, GID fe80::2:c903:0:n1.
        LinkKind::Infiniband => HwAddr::new(&[
            0,
            0,
            0,
            0x48 + n,
            0xfe,
            0x80,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0x02,
            0xc9,
            0x03,
            0,
            0,
            0,
            0x10 * n + 1,
        ]),
        _ => HwAddr::EMPTY,
    }
}

/// A pair of links of kind `kind` (not [`LinkKind::Loopback`]) with IP MTU
/// `mtu`, carrier up, and the handle of the cable between them.
pub fn pair(kind: LinkKind, mtu: usize) -> (WireEnd, WireEnd, Wire) {
    let frame = mtu + kind.header_len();
    let queue = || PacketBuffer::new(vec![PacketMetadata::EMPTY; SLOTS], vec![0u8; SLOTS * frame]);
    let shared = Arc::new(spin::Mutex::new(Shared {
        queue: [queue(), queue()],
        carrier: true,
        cut: false,
        drop_next: [0; 2],
    }));
    let end = |side: usize| WireEnd {
        side,
        kind,
        mtu,
        hw: hw(kind, side),
        peer_hw: hw(kind, 1 - side),
        shared: shared.clone(),
        stage: vec![0; frame],
        staged: 0,
        stats: LinkStats::default(),
        seen: Vec::new(),
    };
    let (a, b) = (end(0), end(1));
    (a, b, Wire { shared })
}

impl<C: ?Sized> Link<C> for WireEnd {
    fn kind(&self) -> LinkKind {
        self.kind
    }
    fn mtu(&self) -> usize {
        self.mtu
    }
    fn carrier(&self) -> bool {
        self.shared.lock().carrier
    }
    fn hw_addr(&self) -> HwAddr {
        self.hw
    }
    fn broadcast(&self) -> HwAddr {
        match self.kind {
            LinkKind::Ether => HwAddr::new(&[0xff; 6]),
            LinkKind::Infiniband => HwAddr::new(&[
                0, 0xff, 0xff, 0xff, 0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff,
                0xff, 0xff, 0xff,
            ]),
            _ => HwAddr::EMPTY,
        }
    }
    fn stats(&self) -> LinkStats {
        self.stats
    }
    fn neighbours(&self, f: &mut dyn FnMut(&Neighbour)) {
        if self.kind == LinkKind::Ether {
            return;
        }
        for &addr in &self.seen {
            f(&Neighbour {
                addr,
                lladdr: (!self.peer_hw.is_empty()).then_some(self.peer_hw),
                state: if self.peer_hw.is_empty() {
                    NeighState::Noarp
                } else {
                    NeighState::Reachable
                },
            });
        }
    }
    fn receive(&mut self, _ctx: &mut C, buf: &mut [u8]) -> Option<usize> {
        let n = {
            let mut s = self.shared.lock();
            let ((), p) = s.queue[self.side].dequeue().ok()?;
            let Some(dst) = buf.get_mut(..p.len()) else {
                self.stats.rx_errors += 1;
                return None;
            };
            dst.copy_from_slice(p);
            p.len()
        };
        self.stats.count_rx(n);
        if self.kind != LinkKind::Ether && n >= 20 && buf[0] >> 4 == 4 {
            let src = Ipv4Address::new(buf[12], buf[13], buf[14], buf[15]);
            if !src.is_broadcast()
                && !src.is_multicast()
                && !src.is_unspecified()
                && !self.seen.contains(&src)
                && self.seen.len() < 8
            {
                self.seen.push(src);
            }
        }
        Some(n)
    }
    fn tx_ready(&mut self, _ctx: &mut C) -> bool {
        true
    }
    fn tx_buffer(&mut self, _ctx: &mut C, len: usize) -> Option<&mut [u8]> {
        let b = self.stage.get_mut(..len)?;
        self.staged = len;
        Some(b)
    }
    fn tx_commit(&mut self, _ctx: &mut C, _next_hop: Ipv4Address) {
        let len = core::mem::take(&mut self.staged);
        let mut s = self.shared.lock();
        let to = 1 - self.side;
        if !s.carrier {
            self.stats.tx_carrier_errors += 1;
            return;
        }
        self.stats.count_tx(len);
        if s.cut {
            return;
        }
        if s.drop_next[to] > 0 {
            s.drop_next[to] -= 1;
            return;
        }
        match s.queue[to].enqueue(len, ()) {
            Ok(b) => b.copy_from_slice(&self.stage[..len]),
            Err(_) => self.stats.tx_dropped += 1,
        }
    }
}
