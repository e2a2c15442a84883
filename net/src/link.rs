//! The link-interface trait that every network device implements for the IP stack: what Linux's `struct net_device` and its `ndo_start_xmit` give the stack, reduced to a busy-polled trait.
//!
//! Leaves out: queues and qdiscs, offloads (checksum, segmentation),
//! multicast lists, administrative up/down, MTU changes, and interrupts: the
//! stack asks the link for received packets when it is polled, and the link
//! never calls the stack.
//!
//! Two media, as smoltcp has them. An Ethernet link ([`LinkKind::Ether`])
//! carries whole Ethernet frames and smoltcp does ARP over it. Every other
//! link carries bare IPv4 packets ([`smoltcp::phy::Medium::Ip`]); when such a
//! link needs address resolution (IPoIB's ARP, hardware type 32), it does it
//! below the trait, from the next-hop address the stack hands to
//! [`Link::tx_commit`], and shows its table through [`Link::neighbours`].

use core::any::Any;
use core::fmt;

use smoltcp::phy::Medium;
pub use smoltcp::wire::{Ipv4Address, Ipv4Cidr};

/// What a link is, in the words of `ip link` (`link/infiniband`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// `lo`: IP packets handed straight back.
    Loopback,
    /// An Ethernet port (mlx4_en): frames with a 14-byte header; smoltcp
    /// does ARP.
    Ether,
    /// IP over InfiniBand: IP packets; the link resolves next hops (its own
    /// ARP and path records) below the trait.
    Infiniband,
    /// A point-to-point IP link with no link-layer address (a tun device).
    None,
}

impl LinkKind {
    /// The smoltcp medium: Ethernet frames or bare IP packets.
    pub fn medium(self) -> Medium {
        match self {
            LinkKind::Ether => Medium::Ethernet,
            _ => Medium::Ip,
        }
    }

    /// The word after `link/` in `ip link`.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Loopback => "loopback",
            LinkKind::Ether => "ether",
            LinkKind::Infiniband => "infiniband",
            LinkKind::None => "none",
        }
    }

    /// Bytes of link-layer header in front of the IP packet in what the
    /// link carries (14 for Ethernet, none for the IP medium).
    pub fn header_len(self) -> usize {
        match self {
            LinkKind::Ether => 14,
            _ => 0,
        }
    }
}

/// The longest hardware address a link has (IPoIB's: flags, QPN, GID).
pub const HW_ADDR_MAX: usize = 20;

/// A hardware address of up to [`HW_ADDR_MAX`] bytes (6 for Ethernet, 20 for
/// IPoIB), printed as `ip link` prints it: lower-case hex bytes joined by
/// colons.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct HwAddr {
    len: u8,
    bytes: [u8; HW_ADDR_MAX],
}

impl HwAddr {
    /// No address (a tun-like link).
    pub const EMPTY: HwAddr = HwAddr {
        len: 0,
        bytes: [0; HW_ADDR_MAX],
    };

    /// The first [`HW_ADDR_MAX`] bytes of `b`.
    pub fn new(b: &[u8]) -> HwAddr {
        let n = b.len().min(HW_ADDR_MAX);
        let mut bytes = [0; HW_ADDR_MAX];
        bytes[..n].copy_from_slice(&b[..n]);
        HwAddr {
            len: n as u8,
            bytes,
        }
    }

    /// The address bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Whether there is no address.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Display for HwAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.as_bytes().iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for HwAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A link's counters, the columns of `ip -s link` (Linux's
/// `rtnl_link_stats64`, the part iproute2 prints by default). The link
/// counts what it moves and what it drops itself; the stack adds the
/// packets it discards (malformed, no carrier) to the `dropped` columns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Bytes received (the packet as handed to the stack).
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Bad packets received (a short or malformed link header, a receive
    /// completion in error).
    pub rx_errors: u64,
    /// Good packets not delivered (no buffer, unknown protocol).
    pub rx_dropped: u64,
    /// Packets the hardware missed (receive ring empty).
    pub rx_missed: u64,
    /// Multicast and broadcast packets received.
    pub multicast: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Sends that failed (a send completion in error).
    pub tx_errors: u64,
    /// Packets not sent (no route to the next hop, neighbour unresolved).
    pub tx_dropped: u64,
    /// Packets not sent for lack of carrier.
    pub tx_carrier_errors: u64,
    /// Collisions (always 0 on these links; kept for the column).
    pub collisions: u64,
}

impl LinkStats {
    /// Counts one packet of `len` bytes received.
    pub fn count_rx(&mut self, len: usize) {
        self.rx_packets += 1;
        self.rx_bytes += len as u64;
    }

    /// Counts one packet of `len` bytes sent.
    pub fn count_tx(&mut self, len: usize) {
        self.tx_packets += 1;
        self.tx_bytes += len as u64;
    }
}

/// The state of a neighbour entry, in `ip neigh`'s words (Linux `NUD_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighState {
    /// Resolution under way (an ARP request is out).
    Incomplete,
    /// Resolved and confirmed recently.
    Reachable,
    /// Resolved, not confirmed for a while; still used.
    Stale,
    /// Waiting before a probe.
    Delay,
    /// Being probed again.
    Probe,
    /// Resolution failed.
    Failed,
    /// No resolution needed.
    Noarp,
    /// Set by hand, never expires.
    Permanent,
}

impl NeighState {
    /// The word `ip neigh` prints.
    pub fn name(self) -> &'static str {
        match self {
            NeighState::Incomplete => "INCOMPLETE",
            NeighState::Reachable => "REACHABLE",
            NeighState::Stale => "STALE",
            NeighState::Delay => "DELAY",
            NeighState::Probe => "PROBE",
            NeighState::Failed => "FAILED",
            NeighState::Noarp => "NOARP",
            NeighState::Permanent => "PERMANENT",
        }
    }
}

/// One line of `ip neigh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// The neighbour's IPv4 address.
    pub addr: Ipv4Address,
    /// Its hardware address, once resolved (IPoIB: flags byte, QPN, GID).
    pub lladdr: Option<HwAddr>,
    /// Where resolution stands.
    pub state: NeighState,
}

/// A network device as the IP stack sees it, busy-polled.
///
/// `C` is the context the stack's caller passes to every poll (the
/// kernel's: ib_core, through which IPoIB posts its work requests and polls
/// its completion queue; host tests: `()`). Nothing here may block or
/// panic on what comes off the wire.
///
/// What a link carries: bare IPv4 packets, or Ethernet frames when
/// [`kind`](Link::kind) is [`LinkKind::Ether`].
pub trait Link<C: ?Sized = ()>: Send {
    /// What kind of link this is (decides the medium).
    fn kind(&self) -> LinkKind;

    /// The IP MTU in bytes (IPoIB datagram mode: 2044; Ethernet: 1500,
    /// not counting its header).
    fn mtu(&self) -> usize;

    /// Whether the carrier is up (IPoIB: the port is Active and the
    /// broadcast group joined). Without it the stack sends nothing and
    /// counts the packets it could not send.
    fn carrier(&self) -> bool;

    /// The link's own hardware address (`ip link`: 20 bytes for IPoIB, 6
    /// for Ethernet, none for a tun-like link).
    fn hw_addr(&self) -> HwAddr;

    /// The broadcast hardware address `ip link` prints after `brd`.
    fn broadcast(&self) -> HwAddr {
        HwAddr::EMPTY
    }

    /// The link's counters.
    fn stats(&self) -> LinkStats;

    /// Calls `f` for each entry of the link's own neighbour table (an IP
    /// link that resolves below the trait; an Ethernet link's table is
    /// smoltcp's, which the stack shows itself).
    fn neighbours(&self, f: &mut dyn FnMut(&Neighbour)) {
        let _ = f;
    }

    /// The link's IPv4 addresses changed (`ip addr add|del`, the command
    /// line): `addrs` is the whole new list. A link that resolves below
    /// the trait answers ARP requests for these (and may announce them).
    fn addrs_changed(&mut self, addrs: &[Ipv4Cidr]) {
        let _ = addrs;
    }

    /// Housekeeping once per stack poll, before receiving: resolution
    /// retries, timeouts, refilling a receive ring.
    fn poll(&mut self, ctx: &mut C, now_us: u64) {
        let _ = (ctx, now_us);
    }

    /// Copies the next received packet (frame, for Ethernet) into `buf`,
    /// which holds at least `mtu()` plus the link header, and returns its
    /// length; `None` when nothing is waiting. A packet that does not fit
    /// is the link's to drop and count.
    fn receive(&mut self, ctx: &mut C, buf: &mut [u8]) -> Option<usize>;

    /// Whether [`tx_buffer`](Link::tx_buffer) would give a buffer now (a
    /// send slot is free). While it says no, the stack keeps its packets.
    fn tx_ready(&mut self, ctx: &mut C) -> bool;

    /// A buffer of exactly `len` bytes for the next packet (frame); the
    /// stack writes the packet into it and then calls
    /// [`tx_commit`](Link::tx_commit). `None` if no slot is free or `len`
    /// is too long.
    fn tx_buffer(&mut self, ctx: &mut C, len: usize) -> Option<&mut [u8]>;

    /// Sends the packet just written into the buffer from
    /// [`tx_buffer`](Link::tx_buffer). `next_hop` is the IPv4 address the
    /// packet goes to on this link: the destination itself when it is on
    /// a connected network, else the gateway of the route (an IP-medium
    /// link resolves it; an Ethernet link can ignore it, smoltcp has
    /// already put the resolved address into the frame).
    fn tx_commit(&mut self, ctx: &mut C, next_hop: Ipv4Address);

    /// The RDMA port this link runs over, for the RDMA CM (Linux finds it
    /// through the GID table's netdev): the owner's handle of the device
    /// (the kernel's: ib_core's device id) and the port. `None` (the
    /// default) for a link with no RDMA port behind it.
    fn rdma_port(&self) -> Option<(u32, u8)> {
        None
    }

    /// A VLAN device over this link (`ip link add link LOWER name NAME type
    /// vlan id VID`; `lower` is this link's name): its link, sharing this
    /// one's hardware. The default: an error, as Linux's for a device
    /// without VLAN support.
    fn add_vlan(
        &mut self,
        ctx: &mut C,
        vid: u16,
        lower: &str,
    ) -> Result<alloc::boxed::Box<dyn Link<C>>, alloc::string::String> {
        let _ = (ctx, vid, lower);
        Err(alloc::string::String::from(
            "RTNETLINK answers: Operation not supported",
        ))
    }

    /// For a VLAN device: its VLAN id and the name of the link it is over
    /// (`ip link` prints `NAME@LOWER`). `None` (the default) otherwise.
    fn vlan(&self) -> Option<(u16, &str)> {
        None
    }

    /// The link is being deleted (`ip link delete`): give back what it
    /// holds in the hardware (a VLAN device's VID).
    fn detach(&mut self, ctx: &mut C) {
        let _ = ctx;
    }

    /// The driver behind the link, for what only it knows (IPoIB's
    /// counters by reason, its paths): the console and tests downcast it.
    /// `None` (the default) for a link that offers nothing more.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }

    /// [`as_any`](Link::as_any), mutable.
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        None
    }
}
