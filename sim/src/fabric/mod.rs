//! The wire between ports: cables joining two ports, the packets in flight
//! and their delivery; the switch, its SMA/PMA, LID routing, directed-route
//! processing, the capture and per-packet faults grow here (see the issue
//! "sim: the data path").
//!
//! # The contract between the HCA engines and the fabric
//!
//! * A [`Packet`] is what crosses a cable: the bytes of one InfiniBand
//!   packet from the first byte of the LRH to the last byte of the VCRC,
//!   ICRC and VCRC included, computed by the sender (the HCA engine or the
//!   switch). The fabric reads the LRH (VL, DLID, SLID, LNH, packet length)
//!   and nothing it does not need.
//! * Every port on the fabric (a port of an HCA, a port of a switch) is a
//!   [`PortId`]. An HCA attaches each of its ports with
//!   [`Fabric::attach_hca_port`] and keeps the id.
//! * Enabling a port (INIT_PORT) and disabling it (CLOSE_PORT) is
//!   [`Fabric::set_enabled`]; the physical link is up when both ends of a
//!   cable are enabled ([`Fabric::link_up`]). Each change of a port's link
//!   bumps [`Fabric::link_generation`], so an HCA notices a change (cable
//!   pulled, partner closed) the next time it looks, without callbacks.
//! * Sending is [`Fabric::transmit`]: counted, and queued for delivery at
//!   the far end of the cable (later: through the switch, captured,
//!   faulted). Delivery is pull-based: the receiving HCA takes its due
//!   packets with [`Fabric::receive`] when its engines are stepped.
//! * Lock order: an HCA's own lock first, then the fabric's. The fabric
//!   never calls into an HCA, so two HCAs on one fabric cannot deadlock.
//!   Whoever drives the engines (the front ends) steps every HCA on the
//!   fabric until none makes progress; [`Fabric::next_due`] says when a
//!   delayed packet will be ready.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

/// One packet on the wire: LRH through VCRC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The bytes, LRH first, ICRC and VCRC last.
    pub bytes: Vec<u8>,
}

impl Packet {
    /// LRH virtual lane (bits 7:4 of byte 0).
    pub fn vl(&self) -> Option<u8> {
        self.bytes.first().map(|b| b >> 4)
    }
    /// LRH destination LID (bytes 2-3).
    pub fn dlid(&self) -> Option<u16> {
        Some(u16::from_be_bytes([
            *self.bytes.get(2)?,
            *self.bytes.get(3)?,
        ]))
    }
    /// LRH source LID (bytes 6-7).
    pub fn slid(&self) -> Option<u16> {
        Some(u16::from_be_bytes([
            *self.bytes.get(6)?,
            *self.bytes.get(7)?,
        ]))
    }
}

/// A port on the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortId(pub u32);

/// What a fabric port belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Port `port` (1-based) of the HCA with node GUID `node_guid`.
    Hca {
        /// Node GUID of the HCA.
        node_guid: u64,
        /// Port number on the HCA.
        port: u8,
    },
}

/// Why a fabric operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricError {
    /// No such port.
    NoSuchPort(PortId),
    /// The port already has a cable.
    AlreadyCabled(PortId),
    /// A cable from a port to itself.
    SelfLoop(PortId),
}

impl core::fmt::Display for FabricError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FabricError::NoSuchPort(p) => write!(f, "no fabric port {}", p.0),
            FabricError::AlreadyCabled(p) => write!(f, "fabric port {} already has a cable", p.0),
            FabricError::SelfLoop(p) => write!(f, "a cable from fabric port {} to itself", p.0),
        }
    }
}

impl std::error::Error for FabricError {}

#[derive(Debug)]
struct FabPort {
    owner: Owner,
    enabled: bool,
    peer: Option<PortId>,
    link_generation: u64,
    /// Packets delivered to this port, with the time they become due.
    inbound: VecDeque<(u64, Packet)>,
}

/// Packets queued at one port before the receiver takes them; past this
/// the port drops (and a later issue counts it as the card would).
pub const MAX_INBOUND: usize = 4096;

/// The fabric: ports, cables and packets in flight.
#[derive(Debug, Default)]
pub struct Fabric {
    ports: BTreeMap<PortId, FabPort>,
    next_id: u32,
    /// Wire latency added to every packet, in nanoseconds.
    pub latency_ns: u64,
}

/// A fabric shared by the HCAs on it (lock order: HCA, then fabric).
pub type SharedFabric = Arc<Mutex<Fabric>>;

impl Fabric {
    /// An empty fabric.
    pub fn new() -> Fabric {
        Fabric::default()
    }

    /// An empty fabric behind a shared handle.
    pub fn shared() -> SharedFabric {
        Arc::new(Mutex::new(Fabric::new()))
    }

    /// Adds port `port` of the HCA with node GUID `node_guid`; the port
    /// starts disabled and uncabled.
    pub fn attach_hca_port(&mut self, node_guid: u64, port: u8) -> PortId {
        let id = PortId(self.next_id);
        self.next_id += 1;
        self.ports.insert(
            id,
            FabPort {
                owner: Owner::Hca { node_guid, port },
                enabled: false,
                peer: None,
                link_generation: 0,
                inbound: VecDeque::new(),
            },
        );
        id
    }

    /// What port `p` belongs to.
    pub fn owner(&self, p: PortId) -> Option<Owner> {
        self.ports.get(&p).map(|fp| fp.owner)
    }

    /// Joins `a` and `b` with a cable.
    pub fn connect(&mut self, a: PortId, b: PortId) -> Result<(), FabricError> {
        if a == b {
            return Err(FabricError::SelfLoop(a));
        }
        for p in [a, b] {
            match self.ports.get(&p) {
                None => return Err(FabricError::NoSuchPort(p)),
                Some(fp) if fp.peer.is_some() => return Err(FabricError::AlreadyCabled(p)),
                Some(_) => {}
            }
        }
        let before = [self.link_up(a), self.link_up(b)];
        self.port_mut(a).peer = Some(b);
        self.port_mut(b).peer = Some(a);
        self.note_link_change(a, before[0]);
        self.note_link_change(b, before[1]);
        Ok(())
    }

    /// Pulls the cable at `p` (if any); packets in flight to either end
    /// are lost.
    pub fn unplug(&mut self, p: PortId) -> Result<(), FabricError> {
        let Some(peer) = self.ports.get(&p).ok_or(FabricError::NoSuchPort(p))?.peer else {
            return Ok(());
        };
        let before = [self.link_up(p), self.link_up(peer)];
        for (q, was) in [(p, before[0]), (peer, before[1])] {
            let fp = self.port_mut(q);
            fp.peer = None;
            fp.inbound.clear();
            self.note_link_change(q, was);
        }
        Ok(())
    }

    /// The port at the other end of `p`'s cable.
    pub fn peer(&self, p: PortId) -> Option<PortId> {
        self.ports.get(&p)?.peer
    }

    /// Enables (INIT_PORT) or disables (CLOSE_PORT) port `p`.
    pub fn set_enabled(&mut self, p: PortId, enabled: bool) -> Result<(), FabricError> {
        let peer = self.ports.get(&p).ok_or(FabricError::NoSuchPort(p))?.peer;
        let before_p = self.link_up(p);
        let before_peer = peer.map(|q| self.link_up(q));
        self.port_mut(p).enabled = enabled;
        self.note_link_change(p, before_p);
        if let (Some(q), Some(was)) = (peer, before_peer) {
            self.note_link_change(q, was);
        }
        Ok(())
    }

    /// The physical link at `p` is up: cabled, and both ends enabled.
    pub fn link_up(&self, p: PortId) -> bool {
        let Some(fp) = self.ports.get(&p) else {
            return false;
        };
        fp.enabled
            && fp
                .peer
                .and_then(|q| self.ports.get(&q))
                .is_some_and(|peer| peer.enabled)
    }

    /// Bumped on every change of [`Fabric::link_up`] at `p`.
    pub fn link_generation(&self, p: PortId) -> u64 {
        self.ports.get(&p).map_or(0, |fp| fp.link_generation)
    }

    /// Sends `pkt` out of port `p` at time `now_ns`. A packet sent on a
    /// link that is down, or to a full port, is dropped; the return value
    /// says whether it was queued for delivery.
    pub fn transmit(&mut self, p: PortId, pkt: Packet, now_ns: u64) -> bool {
        if !self.link_up(p) {
            return false;
        }
        let Some(peer) = self.ports.get(&p).and_then(|fp| fp.peer) else {
            return false;
        };
        let due = now_ns.saturating_add(self.latency_ns);
        let q = &mut self.port_mut(peer).inbound;
        if q.len() >= MAX_INBOUND {
            return false;
        }
        q.push_back((due, pkt));
        true
    }

    /// The next packet due at port `p` by `now_ns`.
    pub fn receive(&mut self, p: PortId, now_ns: u64) -> Option<Packet> {
        let q = &mut self.ports.get_mut(&p)?.inbound;
        if q.front().is_some_and(|(due, _)| *due <= now_ns) {
            q.pop_front().map(|(_, pkt)| pkt)
        } else {
            None
        }
    }

    /// The earliest time a queued packet becomes due anywhere.
    pub fn next_due(&self) -> Option<u64> {
        self.ports
            .values()
            .filter_map(|fp| fp.inbound.front().map(|(due, _)| *due))
            .min()
    }

    fn port_mut(&mut self, p: PortId) -> &mut FabPort {
        // Callers checked that `p` exists; a missing port is a model bug
        // that must not take the process down, so it gets a scratch port.
        self.ports.entry(p).or_insert_with(|| FabPort {
            owner: Owner::Hca {
                node_guid: 0,
                port: 0,
            },
            enabled: false,
            peer: None,
            link_generation: 0,
            inbound: VecDeque::new(),
        })
    }

    fn note_link_change(&mut self, p: PortId, before: bool) {
        if self.link_up(p) != before {
            let fp = self.port_mut(p);
            fp.link_generation += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(dlid: u16) -> Packet {
        let mut b = vec![0u8; 8 + 6];
        b[2..4].copy_from_slice(&dlid.to_be_bytes());
        Packet { bytes: b }
    }

    #[test]
    fn link_needs_cable_and_both_ends_enabled() {
        let mut f = Fabric::new();
        let a = f.attach_hca_port(1, 1);
        let b = f.attach_hca_port(2, 1);
        assert!(!f.link_up(a));
        f.set_enabled(a, true).unwrap();
        f.set_enabled(b, true).unwrap();
        assert!(!f.link_up(a), "no cable yet");
        f.connect(a, b).unwrap();
        assert!(f.link_up(a) && f.link_up(b));
        assert_eq!(f.link_generation(a), 1);
        f.set_enabled(b, false).unwrap();
        assert!(!f.link_up(a), "partner closed its port");
        assert_eq!(f.link_generation(a), 2);
        assert_eq!(f.connect(a, a), Err(FabricError::SelfLoop(a)));
        assert_eq!(f.connect(a, b), Err(FabricError::AlreadyCabled(a)));
    }

    #[test]
    fn packets_cross_the_cable_in_order_and_not_on_a_dead_link() {
        let mut f = Fabric::new();
        let a = f.attach_hca_port(1, 1);
        let b = f.attach_hca_port(2, 1);
        f.connect(a, b).unwrap();
        assert!(!f.transmit(a, pkt(1), 0), "link down: dropped");
        f.set_enabled(a, true).unwrap();
        f.set_enabled(b, true).unwrap();
        f.latency_ns = 100;
        assert!(f.transmit(a, pkt(7), 0));
        assert!(f.transmit(a, pkt(8), 0));
        assert_eq!(f.receive(b, 99), None, "not due yet");
        assert_eq!(f.next_due(), Some(100));
        assert_eq!(f.receive(b, 100).and_then(|p| p.dlid()), Some(7));
        assert_eq!(f.receive(b, 100).and_then(|p| p.dlid()), Some(8));
        assert_eq!(f.receive(a, 100), None);
        f.transmit(b, pkt(9), 200);
        f.unplug(a).unwrap();
        assert_eq!(f.receive(a, 1000), None, "lost with the cable");
        assert!(!f.link_up(b));
    }
}
