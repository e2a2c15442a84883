//! The loopback link `lo`, in the part of Linux's `drivers/net/loopback.c` that matters here: every packet sent is received again.
//!
//! Leaves out: per-CPU counters and the `lo`-only offloads. The packets wait
//! in one ring of preallocated bytes (smoltcp's packet buffer): nothing is
//! allocated per packet.

use alloc::vec;

use smoltcp::storage::{PacketBuffer, PacketMetadata};

use crate::link::{HwAddr, Ipv4Address, Link, LinkKind, LinkStats};

/// Linux's loopback MTU.
pub const MTU: usize = 65536;
/// Packets that may wait at once.
const SLOTS: usize = 64;
/// Bytes that may wait at once (four packets of the largest size).
const BYTES: usize = 4 * MTU;

/// `lo`.
pub struct Loopback {
    queue: PacketBuffer<'static, ()>,
    stats: LinkStats,
}

impl Default for Loopback {
    fn default() -> Self {
        Self::new()
    }
}

impl Loopback {
    /// An empty loopback.
    pub fn new() -> Loopback {
        Loopback {
            queue: PacketBuffer::new(vec![PacketMetadata::EMPTY; SLOTS], vec![0u8; BYTES]),
            stats: LinkStats::default(),
        }
    }
}

impl<C: ?Sized> Link<C> for Loopback {
    fn kind(&self) -> LinkKind {
        LinkKind::Loopback
    }
    fn mtu(&self) -> usize {
        MTU
    }
    fn carrier(&self) -> bool {
        true
    }
    fn hw_addr(&self) -> HwAddr {
        HwAddr::new(&[0; 6])
    }
    fn broadcast(&self) -> HwAddr {
        HwAddr::new(&[0; 6])
    }
    fn stats(&self) -> LinkStats {
        self.stats
    }
    fn receive(&mut self, _ctx: &mut C, buf: &mut [u8]) -> Option<usize> {
        let ((), p) = self.queue.dequeue().ok()?;
        let Some(dst) = buf.get_mut(..p.len()) else {
            self.stats.rx_dropped += 1;
            return Some(0);
        };
        dst.copy_from_slice(p);
        self.stats.count_rx(p.len());
        Some(p.len())
    }
    fn tx_ready(&mut self, _ctx: &mut C) -> bool {
        !self.queue.is_full()
    }
    fn tx_buffer(&mut self, _ctx: &mut C, len: usize) -> Option<&mut [u8]> {
        if len > MTU {
            return None;
        }
        let b = self.queue.enqueue(len, ()).ok()?;
        self.stats.count_tx(len);
        Some(b)
    }
    fn tx_commit(&mut self, _ctx: &mut C, _next_hop: Ipv4Address) {}
}
