//! Port of Linux `drivers/infiniband/ulp/ipoib` in datagram mode (RFC 4391/4392), busy-polled: every InfiniBand port becomes an IP link (`ib0`, `ib1`, ...) carrying IPv4 over a UD QP, with IPoIB's ARP, the port's broadcast group and path records from the SA.
//!
//! Left out: connected mode (`ipoib_cm.c`: our hardware address says
//! datagram, flags byte 0, so a Linux peer never asks for it), P_Key child
//! interfaces (`ipoib_vlan.c`), checksum and large-send offloads (the model
//! keeps the capability bits clear, and our stack computes checksums), IPv6
//! and IP multicast groups other than the broadcast group (an IP multicast
//! packet is a counted drop), sysfs, netlink and ethtool, and the NAPI and
//! interrupt paths: the stack polls the link, which polls its CQs.
//!
//! Files keep Linux's names: this file is `ipoib.h` (wire constants, the
//! 20-byte hardware address, the 4-byte header, counters),
//! [`ipoib_main`] is `ipoib_main.c` (the ib_client, the device, neighbours
//! and paths, `ipoib_start_xmit`, and the [`net::Link`] the stack drives),
//! [`ipoib_ib`] is `ipoib_ib.c` (receive ring, send ring, completions),
//! [`ipoib_verbs`] is `ipoib_verbs.c` (PD, CQs, the UD QP, attach),
//! [`ipoib_multicast`] is `ipoib_multicast.c` (the broadcast join), and
//! [`arp`] is the part of Linux's `net/ipv4/arp.c` and
//! `net/core/neighbour.c` an IPoIB device needs (the kernel's generic ARP
//! runs over a device of type `ARPHRD_INFINIBAND` in Linux; here it sits
//! below the link trait, since smoltcp's ARP knows only Ethernet).
//! [`rdma_net`] lends the stack and these links' ARP tables to ib_core's
//! RDMA CM (its `addr::IpNet`), as Linux's `addr.c` reads the neighbour
//! table of the device a route leaves by.
//!
//! # Using it
//!
//! [`init`] registers the client (and ib_core's SA and multicast clients it
//! uses) before the devices are registered; each InfiniBand port gets a
//! name (`ib0`, `ib1`, ... in device and port order; a port whose link
//! layer is not InfiniBand is declined). Once a port's link is up (trained:
//! any state but Down), [`ports_ready`] hands it out once and
//! [`IpoibDev::open`] makes its link: a UD QP with its CQs and rings, the
//! join of the broadcast group started. The caller registers the link with
//! the IP stack (`net::Stack::add_link`); from then on the stack's polls
//! drive it. The carrier comes up once the port is Active and the
//! broadcast group is joined.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod arp;
pub mod ipoib_ib;
pub mod ipoib_main;
pub mod ipoib_multicast;
pub mod ipoib_verbs;
pub mod rdma_net;

use core::fmt;

use ib_core::verbs::Gid;

pub use ipoib_main::{IpoibClient, IpoibDev, PortInfo, init, init_with, ports, ports_ready};

/// Bytes of the IPoIB encapsulation header (`IPOIB_ENCAP_LEN`): the
/// EtherType and two reserved bytes.
pub const IPOIB_ENCAP_LEN: usize = 4;
/// Bytes of an IPoIB hardware address (`INFINIBAND_ALEN`).
pub const INFINIBAND_ALEN: usize = 20;
/// Bytes of the GRH area in front of every UD receive (`IB_GRH_BYTES`).
pub const IB_GRH_BYTES: usize = 40;
/// The IP MTU of datagram mode on a 2048-byte IB MTU
/// (`IPOIB_UD_MTU(2048)`).
pub const IPOIB_UD_MTU: usize = 2048 - IPOIB_ENCAP_LEN;
/// Connected mode's flag in the first byte of a hardware address
/// (`IPOIB_FLAGS_RC`); ours is never set.
pub const IPOIB_FLAGS_RC: u8 = 0x80;
/// Unreliable-connected flag (`IPOIB_FLAGS_UC`).
pub const IPOIB_FLAGS_UC: u8 = 0x40;
/// QPN of the broadcast address (and of every multicast destination).
pub const IPOIB_MCAST_QPN: u32 = 0xff_ffff;
/// EtherType of IPv4.
pub const ETH_P_IP: u16 = 0x0800;
/// EtherType of ARP.
pub const ETH_P_ARP: u16 = 0x0806;

/// `IPOIB_UD_MTU(ib_mtu)`: the IP MTU a UD datagram of `ib_mtu` bytes
/// carries.
pub const fn ud_mtu(ib_mtu: usize) -> usize {
    ib_mtu.saturating_sub(IPOIB_ENCAP_LEN)
}

/// The MGID of the IPv4 broadcast group of partition `pkey` (with the
/// full-member bit set, as Linux's `ipoib_add_port` does):
/// `ff12:401b:PKEY::ffff:ffff` (link-local scope, IPv4 signature).
pub fn bcast_mgid(pkey: u16) -> Gid {
    let pkey = pkey | 0x8000;
    let mut g = [0u8; 16];
    g[..4].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b]);
    g[4..6].copy_from_slice(&pkey.to_be_bytes());
    g[12..].copy_from_slice(&[0xff; 4]);
    Gid(g)
}

/// An IPoIB hardware address: a flags byte, the 24-bit QPN, the 16-byte
/// port GID (RFC 4391 section 9.1.1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IpoibAddr(pub [u8; INFINIBAND_ALEN]);

impl IpoibAddr {
    /// The address of QP `qpn` on the port with GID `gid` (flags 0:
    /// datagram mode only).
    pub fn new(qpn: u32, gid: &Gid) -> IpoibAddr {
        let mut a = [0u8; INFINIBAND_ALEN];
        a[1..4].copy_from_slice(&(qpn & 0xff_ffff).to_be_bytes()[1..]);
        a[4..].copy_from_slice(&gid.0);
        IpoibAddr(a)
    }

    /// The broadcast address of partition `pkey`: QPN 0xffffff and the
    /// broadcast MGID.
    pub fn broadcast(pkey: u16) -> IpoibAddr {
        IpoibAddr::new(IPOIB_MCAST_QPN, &bcast_mgid(pkey))
    }

    /// From 20 wire bytes.
    pub fn from_bytes(b: &[u8]) -> Option<IpoibAddr> {
        b.get(..INFINIBAND_ALEN)?.try_into().ok().map(IpoibAddr)
    }

    /// The flags byte (RC/UC bits of connected mode).
    pub fn flags(&self) -> u8 {
        self.0[0]
    }

    /// The QPN.
    pub fn qpn(&self) -> u32 {
        u32::from_be_bytes([0, self.0[1], self.0[2], self.0[3]])
    }

    /// The GID.
    pub fn gid(&self) -> Gid {
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.0[4..]);
        Gid(g)
    }

    /// Whether this can be a unicast neighbour's address: a QPN other than
    /// 0, 1 and the multicast QPN, and a GID that is neither zero nor
    /// multicast.
    pub fn is_valid_unicast(&self) -> bool {
        let qpn = self.qpn();
        let g = self.gid();
        qpn > 1 && qpn != IPOIB_MCAST_QPN && g.0[0] != 0xff && g.0 != [0; 16]
    }

    /// As `ip link` and `ip neigh` print it.
    pub fn hw(&self) -> net::HwAddr {
        net::HwAddr::new(&self.0)
    }
}

impl fmt::Display for IpoibAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.hw(), f)
    }
}

impl fmt::Debug for IpoibAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a received IPoIB frame was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Shorter than the 4-byte header.
    Short,
    /// The EtherType is neither IPv4 nor ARP.
    UnknownType(u16),
    /// IPv4 by its EtherType, but the packet does not start with an IPv4
    /// header (version 4, header at least 20 bytes, in the frame).
    BadIpv4,
}

/// What a received frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// An IPv4 packet (the stack checks the rest of it).
    Ipv4(&'a [u8]),
    /// An ARP packet (not parsed yet: [`arp::ArpPacket::parse`]).
    Arp(&'a [u8]),
}

/// Reads the 4-byte IPoIB header (`struct ipoib_header`: EtherType, two
/// reserved bytes, which the receiver ignores) and what follows it. Never
/// panics, whatever the bytes.
pub fn parse_frame(b: &[u8]) -> Result<Frame<'_>, FrameError> {
    let (hdr, payload) = b
        .split_at_checked(IPOIB_ENCAP_LEN)
        .ok_or(FrameError::Short)?;
    match u16::from_be_bytes([hdr[0], hdr[1]]) {
        ETH_P_IP => {
            let ok = payload
                .first()
                .is_some_and(|&v| v >> 4 == 4 && usize::from(v & 0xf) * 4 >= 20)
                && payload.len() >= 20;
            if ok {
                Ok(Frame::Ipv4(payload))
            } else {
                Err(FrameError::BadIpv4)
            }
        }
        ETH_P_ARP => Ok(Frame::Arp(payload)),
        t => Err(FrameError::UnknownType(t)),
    }
}

/// Writes the 4-byte header for `proto` at the front of `b`.
pub fn put_header(b: &mut [u8], proto: u16) {
    if let Some(h) = b.get_mut(..IPOIB_ENCAP_LEN) {
        h[..2].copy_from_slice(&proto.to_be_bytes());
        h[2..].fill(0);
    }
}

/// Sizes and times of an IPoIB link (Linux's module parameters and the
/// neighbour-table defaults of `arp_tbl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Receive WRs posted (`recv_queue_size`; Linux 256).
    pub recv_queue_size: u32,
    /// Send WRs in flight (`send_queue_size`; Linux 128).
    pub send_queue_size: u32,
    /// Neighbour entries (IP to hardware address).
    pub max_neighs: usize,
    /// Path entries (GID to path record and address handle).
    pub max_paths: usize,
    /// Packets held while their neighbour or path resolves, in all.
    pub pending_slots: usize,
    /// Of those, at most this many per neighbour
    /// (`IPOIB_MAX_PATH_REC_QUEUE`).
    pub pending_per_neigh: usize,
    /// ARP: time between requests (`retrans_time`, 1 s).
    pub arp_retrans_us: u64,
    /// ARP: broadcast requests before an unresolved neighbour fails
    /// (`mcast_solicit`, 3).
    pub arp_mcast_solicit: u32,
    /// ARP: unicast probes of a stale neighbour before it fails
    /// (`ucast_solicit`, 3).
    pub arp_ucast_solicit: u32,
    /// How long a confirmed neighbour is REACHABLE (`base_reachable_time`,
    /// 30 s).
    pub reachable_us: u64,
    /// How long a stale neighbour in use waits before it is probed
    /// (`delay_first_probe_time`, 5 s).
    pub delay_probe_us: u64,
    /// A STALE or FAILED neighbour unused this long goes
    /// (`gc_stale_time`, 60 s).
    pub gc_stale_us: u64,
    /// How long one path record query may take (Linux's `path_rec_start`
    /// gives 1 s; the SA client retries within it).
    pub path_query_ms: u32,
    /// A path record is used this long, then asked for again while the old
    /// one still carries traffic.
    pub path_lifetime_us: u64,
    /// After a failed path query, the next one waits this long (doubling
    /// up to 16 times this).
    pub path_backoff_us: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            recv_queue_size: 256,
            send_queue_size: 128,
            max_neighs: 64,
            max_paths: 64,
            pending_slots: 32,
            pending_per_neigh: 3,
            arp_retrans_us: 1_000_000,
            arp_mcast_solicit: 3,
            arp_ucast_solicit: 3,
            reachable_us: 30_000_000,
            delay_probe_us: 5_000_000,
            gc_stale_us: 60_000_000,
            path_query_ms: 3000,
            path_lifetime_us: 300_000_000,
            path_backoff_us: 1_000_000,
        }
    }
}

/// What an IPoIB link counted beyond `ip -s link`'s columns: each drop by
/// its reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Receive completions in error (not flushes).
    pub rx_wc_errors: u64,
    /// Receive completions flushed (the QP left RTS).
    pub rx_flushed: u64,
    /// Frames shorter than the GRH area plus the header.
    pub rx_short: u64,
    /// Frames with an EtherType that is neither IPv4 nor ARP.
    pub rx_unknown_type: u64,
    /// IPv4 frames whose payload is not an IPv4 header.
    pub rx_bad_ipv4: u64,
    /// IPv4 packets longer than the stack's buffer.
    pub rx_too_long: u64,
    /// Our own datagrams seen again (source our LID and QPN).
    pub rx_own: u64,
    /// Receive WRs that could not be posted again.
    pub rx_post_errors: u64,
    /// ARP packets received.
    pub arp_rx: u64,
    /// ARP packets that do not parse, or name a bad address.
    pub arp_bad: u64,
    /// ARP replies about an address no entry asked for.
    pub arp_unsolicited: u64,
    /// ARP probes from an unconfigured sender (IP 0.0.0.0), left
    /// unanswered.
    pub arp_probes_ignored: u64,
    /// ARP requests sent (broadcast and unicast probes).
    pub arp_requests_tx: u64,
    /// ARP replies sent.
    pub arp_replies_tx: u64,
    /// Neighbours that failed to resolve (no ARP answer).
    pub neigh_failed: u64,
    /// Packets dropped because their neighbour did not resolve.
    pub tx_unresolved: u64,
    /// Packets dropped because no room was left to hold them while their
    /// neighbour or path resolved.
    pub tx_queue_full: u64,
    /// Packets dropped because the path query for their neighbour failed.
    pub tx_no_path: u64,
    /// IP multicast packets dropped (no multicast groups but broadcast).
    pub tx_multicast: u64,
    /// Packets longer than the broadcast group's MTU allows.
    pub tx_too_long: u64,
    /// Packets with no address to go to (unspecified next hop).
    pub tx_no_dest: u64,
    /// Packets dropped for want of a send slot (and of a slot to wait
    /// in).
    pub tx_ring_full: u64,
    /// Send WRs the device refused.
    pub tx_post_errors: u64,
    /// Send completions in error.
    pub tx_wc_errors: u64,
    /// Path record queries started.
    pub path_queries: u64,
    /// Path record queries that failed (refused, unanswered).
    pub path_failures: u64,
    /// Address handles made for paths.
    pub path_ahs: u64,
    /// Times every path was marked for a new query (SM change, client
    /// reregister, LID change, port up/down).
    pub path_flushes: u64,
    /// Broadcast joins that failed (the multicast client tries again).
    pub join_failures: u64,
    /// Broadcast joins completed (the first and every re-join).
    pub joins: u64,
}

impl Counters {
    /// Each counter with its name (what `ethtool -S` prints).
    pub fn for_each(&self, mut f: impl FnMut(&'static str, u64)) {
        f("rx_wc_errors", self.rx_wc_errors);
        f("rx_flushed", self.rx_flushed);
        f("rx_short", self.rx_short);
        f("rx_unknown_type", self.rx_unknown_type);
        f("rx_bad_ipv4", self.rx_bad_ipv4);
        f("rx_too_long", self.rx_too_long);
        f("rx_own", self.rx_own);
        f("rx_post_errors", self.rx_post_errors);
        f("arp_rx", self.arp_rx);
        f("arp_bad", self.arp_bad);
        f("arp_unsolicited", self.arp_unsolicited);
        f("arp_probes_ignored", self.arp_probes_ignored);
        f("arp_requests_tx", self.arp_requests_tx);
        f("arp_replies_tx", self.arp_replies_tx);
        f("neigh_failed", self.neigh_failed);
        f("tx_unresolved", self.tx_unresolved);
        f("tx_queue_full", self.tx_queue_full);
        f("tx_no_path", self.tx_no_path);
        f("tx_multicast", self.tx_multicast);
        f("tx_too_long", self.tx_too_long);
        f("tx_no_dest", self.tx_no_dest);
        f("tx_ring_full", self.tx_ring_full);
        f("tx_post_errors", self.tx_post_errors);
        f("tx_wc_errors", self.tx_wc_errors);
        f("path_queries", self.path_queries);
        f("path_failures", self.path_failures);
        f("path_ahs", self.path_ahs);
        f("path_flushes", self.path_flushes);
        f("join_failures", self.join_failures);
        f("joins", self.joins);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: deterministic, no dependency.
    pub(crate) struct Rng(pub u64);

    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub fn bytes(&mut self, n: usize) -> alloc::vec::Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    #[test]
    fn broadcast_address_is_linuxs() {
        let b = IpoibAddr::broadcast(0xffff);
        assert_eq!(
            format!("{b}"),
            "00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff"
        );
        // The full-member bit is set in the MGID.
        assert_eq!(bcast_mgid(0x7fff).0[4..6], [0xff, 0xff]);
        assert_eq!(bcast_mgid(0x0012).0[4..6], [0x80, 0x12]);
        assert_eq!(b.qpn(), IPOIB_MCAST_QPN);
        assert!(!b.is_valid_unicast());
    }

    #[test]
    fn hardware_address_holds_flags_qpn_and_gid() {
        let gid = Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_0011);
        let a = IpoibAddr::new(0x0104_8049, &gid);
        assert_eq!(a.flags(), 0);
        assert_eq!(a.qpn(), 0x04_8049);
        assert_eq!(a.gid(), gid);
        assert!(a.is_valid_unicast());
        assert_eq!(
            format!("{a}"),
            "00:04:80:49:fe:80:00:00:00:00:00:00:00:02:c9:03:00:00:00:11"
        );
        let mut rc = a;
        rc.0[0] = IPOIB_FLAGS_RC;
        assert_eq!(rc.qpn(), a.qpn());
        assert!(rc.is_valid_unicast());
        assert!(IpoibAddr::from_bytes(&a.0[..19]).is_none());
        assert_eq!(IpoibAddr::from_bytes(&a.0), Some(a));
    }

    #[test]
    fn frames_parse_by_their_header() {
        let mut ip = [0u8; 24];
        ip[..4].copy_from_slice(&[0x08, 0x00, 0, 0]);
        ip[4] = 0x45;
        assert_eq!(parse_frame(&ip), Ok(Frame::Ipv4(&ip[4..])));
        // Reserved bytes are ignored, as RFC 4391 asks of a receiver.
        ip[2] = 0xaa;
        assert!(matches!(parse_frame(&ip), Ok(Frame::Ipv4(_))));
        assert_eq!(parse_frame(&ip[..3]), Err(FrameError::Short));
        assert_eq!(parse_frame(&ip[..10]), Err(FrameError::BadIpv4));
        ip[4] = 0x65;
        assert_eq!(parse_frame(&ip), Err(FrameError::BadIpv4));
        ip[4] = 0x44;
        assert_eq!(parse_frame(&ip), Err(FrameError::BadIpv4));
        assert!(matches!(
            parse_frame(&[0x08, 0x06, 0, 0, 1]),
            Ok(Frame::Arp(&[1]))
        ));
        assert_eq!(
            parse_frame(&[0x86, 0xdd, 0, 0, 0x60]),
            Err(FrameError::UnknownType(0x86dd))
        );
        let mut b = [0xffu8; 6];
        put_header(&mut b, ETH_P_ARP);
        assert_eq!(b, [0x08, 0x06, 0, 0, 0xff, 0xff]);
    }

    #[test]
    fn random_frames_never_panic() {
        let mut r = Rng(0x1bad_b002);
        let mut taken = 0;
        for i in 0..20_000 {
            let n = (r.next() % 80) as usize;
            let mut b = r.bytes(n);
            // Half of them with a plausible header, to reach the inner
            // checks.
            if i % 2 == 0 && n >= 4 {
                let t = if i % 4 == 0 { ETH_P_IP } else { ETH_P_ARP };
                put_header(&mut b, t);
            }
            if parse_frame(&b).is_ok() {
                taken += 1;
            }
        }
        assert!(taken > 1000, "{taken}");
    }
}
