//! The wire between ports.
//!
//! Cables joining two ports, the packets in flight and their delivery, switches
//! ([`switch`]: SMA, PMA, LID routing, directed-route SMPs), topologies
//! ([`topology`]: `--nodes N`, back to back, ibsim net files), the capture
//! ([`capture`]) and per-packet faults ([`faults`]), host nodes ([`host_node`]: CAs
//! the fabric models itself), ibsim's server protocol ([`ibsim`]: real OpenSM and
//! infiniband-diags attach through it), and an embedded subnet manager ([`sm`])
//! with its SA ([`sa`]). Packet formats are in [`packet`], the IBTA port states in
//! [`port_state`].
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
//! * Link speed: each end publishes the extended link speeds it would
//!   train to (PortInfo LinkSpeedExtEnabled, [`Fabric::set_link_speeds_ext`];
//!   a switch's ports from its SMA, nodes the fabric models itself none),
//!   and reads its peer's ([`Fabric::peer_link_speeds_ext`]); a live link
//!   runs at the fastest speed both ends have, as link training picks it
//!   ([`link_speed_ext_active`]). A change moves the link epoch, so the HCA
//!   at the other end reads it on its next look.
//! * Sending is [`Fabric::transmit`]: counted, and queued for delivery at
//!   the far end of the cable (later: through the switch, captured,
//!   faulted). Delivery is pull-based: the receiving HCA takes its due
//!   packets with [`Fabric::receive`] when its engines are stepped.
//! * Lock order: an HCA's own lock first, then the fabric's. The fabric
//!   never calls into an HCA, so two HCAs on one fabric cannot deadlock.
//!   Whoever drives the engines (the front ends) steps every HCA on the
//!   fabric until none makes progress; [`Fabric::next_due`] says when a
//!   delayed packet will be ready.
//! * Switches live inside the fabric. A packet sent to a switch port is
//!   processed when it is due, during [`Fabric::advance`] (which
//!   [`Fabric::receive`] and [`Fabric::transmit`] call first): forwarded
//!   by the LFT, answered by the switch's SMA/PMA, or dropped and counted.
//!   Scheduled cable pulls and reinsertions also happen in `advance`, so a
//!   front end that wants them on time calls `advance(now)` each step.
//! * The embedded SM ([`Fabric::add_sm`]) sits on a port of its own, like
//!   any fabric-modelled node, and is polled from [`Fabric::advance`] (so
//!   whoever steps the fabric drives it); its SMPs and SA answers are
//!   packets on the wire like everyone else's.
//! * Building a fabric for cx3-emu: [`FabricOptions::parse_arg`] for each
//!   option, then [`FabricOptions::build`] with the node count; it returns
//!   a [`Built`] whose `hcas[i]` gives node i's GUID and the [`PortId`]s of
//!   its ports 1 and 2 (already attached; the HCA keeps them instead of
//!   calling [`Fabric::attach_hca_port`]).
//! * Faults ([`faults`]) act in `transmit` on packets going to an HCA port
//!   (or out of a port a rule names); the capture records what crosses
//!   each cable after the faults (a dropped packet never crossed).
//!
//! # CRCs owed
//!
//! The ICRC and VCRC guard the bytes between the sender's CRC unit and the
//! receiver's. In the model nothing between them can change a byte except
//! an injected fault, so computing both CRCs at the sender and checking
//! them again at every hop would spend most of a data packet's time (five
//! passes over each payload) on checks whose outcome is known. The model's
//! HCAs therefore send data-path packets with their CRCs *owed*
//! ([`Fabric::transmit_owed`], built by [`packet::build_owed_with`]):
//! the last six bytes are placeholders, and the fabric computes the real
//! CRCs ([`packet::seal_owed`]) the moment anything could see or
//! change the bytes: when a fault rule is set (before the faults act, so a
//! corrupted packet fails its checks exactly as before), when a capture
//! runs, when a switch's SMA or PMA or the embedded SM reads the packet,
//! and when a packet leaves through [`Fabric::receive`] or
//! [`Fabric::take_due`]. A switch forwarding an owed packet, and an HCA
//! taking one with [`Fabric::receive_owed`], skip only the CRC comparison
//! that cannot fail; every other check (LRH version and length, routing,
//! headers, keys, PSNs) is made as before, and every packet that was
//! sealed (by a peer, a test, a fault, a capture) is checked in full.
//! The owed state is never a sender's word alone: a packet is taken as
//! owing its CRCs only while its last six bytes are still the builder's
//! placeholders ([`packet::crcs_owed`], checked when it is sent
//! and again by each switch), so a packet with real CRCs handed to
//! [`Fabric::transmit_owed`] keeps them and is checked like any other.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub mod capture;
pub mod eth_switch;
pub mod faults;
pub mod host_node;
pub mod ibsim;
pub mod options;
pub mod packet;
pub mod port_state;
pub mod sa;
pub mod sm;
pub mod switch;
pub mod topology;

pub use capture::{Capture, Direction};
pub use eth_switch::{EthAction, EthSwitch};
pub use faults::{FaultKind, FaultOptions, FaultRule, PacketFaults};
pub use host_node::HostNode;
pub use ibsim::IbsimServer;
pub use options::FabricOptions;
pub use port_state::{LinkLayer, LogicalState, PhysicalState};
pub use sm::{SmConfig, SubnetManager};
pub use switch::Switch;
pub use topology::{Built, Topology, TopologyError};

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

/// A switch on the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SwitchId(pub usize);

/// An Ethernet switch on the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EthSwitchId(pub usize);

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
    /// External port `port` of switch `switch`.
    Switch {
        /// The switch.
        switch: SwitchId,
        /// Port number on the switch (1-based).
        port: u8,
    },
    /// Port `port` of Ethernet switch `switch`.
    EthSwitch {
        /// The switch.
        switch: EthSwitchId,
        /// Port number on the switch (1-based).
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
    /// A cable between an InfiniBand port and an Ethernet port.
    LinkLayerMismatch(PortId, PortId),
}

impl core::fmt::Display for FabricError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FabricError::NoSuchPort(p) => write!(f, "no fabric port {}", p.0),
            FabricError::AlreadyCabled(p) => write!(f, "fabric port {} already has a cable", p.0),
            FabricError::SelfLoop(p) => write!(f, "a cable from fabric port {} to itself", p.0),
            FabricError::LinkLayerMismatch(a, b) => write!(
                f,
                "fabric ports {} and {} carry different link layers (InfiniBand and Ethernet)",
                a.0, b.0
            ),
        }
    }
}

impl std::error::Error for FabricError {}

/// A packet waiting at a port.
#[derive(Debug)]
struct InFlight {
    due: u64,
    pkt: Packet,
    /// Switch hops so far (a routing loop ends at [`MAX_HOPS`]).
    hops: u8,
    /// The packet's ICRC and VCRC are owed (see "CRCs owed" above).
    owed: bool,
}

impl InFlight {
    /// The packet, its CRCs computed if they were owed (`ll`: what the
    /// cable carries).
    fn into_sealed(self, ll: LinkLayer) -> Packet {
        let mut pkt = self.pkt;
        if self.owed {
            seal(ll, &mut pkt.bytes);
        }
        pkt
    }
}

/// Computes the owed CRCs of a packet (InfiniBand) or frame (Ethernet).
fn seal(ll: LinkLayer, b: &mut [u8]) {
    let _ = match ll {
        LinkLayer::Ib => packet::seal_owed(b),
        LinkLayer::Eth => packet::seal_eth_owed(b),
    };
}

/// The packet's CRCs are still the builder's placeholders.
fn crcs_owed(ll: LinkLayer, b: &[u8]) -> bool {
    match ll {
        LinkLayer::Ib => packet::crcs_owed(b),
        LinkLayer::Eth => packet::eth_crcs_owed(b),
    }
}

#[derive(Debug)]
struct FabPort {
    owner: Owner,
    enabled: bool,
    peer: Option<PortId>,
    link_generation: u64,
    /// Packets delivered to this port, with the time they become due.
    inbound: VecDeque<InFlight>,
    name: Option<String>,
    /// The capture's number for the cable at this port.
    link: u64,
    /// The extended link speeds this end would train to (PortInfo
    /// LinkSpeedExtEnabled; 0: none, only SDR/DDR/QDR).
    speeds_ext: u8,
    /// What its cable carries.
    link_layer: LinkLayer,
}

impl FabPort {
    fn new(owner: Owner) -> FabPort {
        FabPort {
            owner,
            enabled: false,
            peer: None,
            link_generation: 0,
            inbound: VecDeque::new(),
            name: None,
            link: 0,
            speeds_ext: 0,
            link_layer: LinkLayer::Ib,
        }
    }
}

/// Packets queued at one port before the receiver takes them; past this
/// the port drops (and a later issue counts it as the card would).
pub const MAX_INBOUND: usize = 4096;

/// Packet buffers [`Fabric::recycle`] keeps at most.
pub const MAX_SPARE: usize = 256;

/// The LinkSpeedExtActive a link trains to when its ends would train to
/// the extended speeds `a` and `b` (LinkSpeedExtEnabled bit masks: bit 0
/// FDR 14.0625 Gb/s, bit 1 EDR 25.78125 Gb/s): the fastest both have, as
/// its PortInfo encoding (1 FDR, 2 EDR; 0 none: the link runs at its
/// LinkSpeedActive).
pub fn link_speed_ext_active(a: u8, b: u8) -> u8 {
    match a & b & 0x3 {
        0 => 0,
        1 => 1,
        _ => 2,
    }
}

/// How long a switch port's link stays down when an SMP makes it retrain
/// (PortPhysicalState Polling on a live link: `ibportstate reset`).
pub const RETRAIN_NS: u64 = 1_000_000;

/// Switch hops after which a packet is taken to be looping and dropped.
pub const MAX_HOPS: u8 = 64;

/// Packets a single [`Fabric::advance`] processes at switches at most, so
/// that a forwarding loop cannot hang a caller.
pub const MAX_SWITCH_WORK: usize = 1 << 16;

/// What happened on the wire, summed over the fabric.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Packets queued for delivery by `transmit` (from HCAs and switches).
    pub sent: u64,
    /// Refused by `transmit`: link down.
    pub link_down: u64,
    /// Refused by `transmit`: the far port's queue was full.
    pub queue_full: u64,
    /// Lost with a pulled cable or a port going down.
    pub lost_in_flight: u64,
    /// Dropped by switches, by reason.
    pub switch_drops: BTreeMap<&'static str, u64>,
}

/// A scheduled change of the cabling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Unplug(PortId),
    Connect(PortId, PortId),
    /// A switch port whose link retrains is enabled again (if no SMP
    /// disabled it meanwhile).
    Retrained(PortId),
}

/// A cable pull waiting for traffic ([`Fabric::unplug_after_bytes`]).
#[derive(Debug, Clone, Copy)]
struct BytePull {
    port: PortId,
    peer: PortId,
    /// Bytes still to cross the cable before it goes.
    left: u64,
    reinsert_after_ns: Option<u64>,
}

/// What the fabric publishes for its HCAs to read without taking its
/// lock: a poll over a quiet fabric (the common case between messages)
/// then costs two atomic loads instead of the lock, an advance and a
/// receive per port.
#[derive(Debug, Default)]
pub struct Activity {
    /// Bumped (under the fabric's lock) on every change of cabling or of
    /// a port's enable: every [`Fabric::link_up`] and
    /// [`Fabric::link_generation`] an HCA last read stays as it was while
    /// this does not move.
    links: AtomicU64,
    /// False only while [`Fabric::advance`] and [`Fabric::receive`] have
    /// nothing to do anywhere: no packet queued at any port, no scheduled
    /// cable change, no switch owing a trap, no embedded SM (it has
    /// timers). Stored under the fabric's lock after each change of those.
    busy: AtomicBool,
}

impl Activity {
    /// The link epoch (see the field).
    pub fn links(&self) -> u64 {
        self.links.load(Ordering::Acquire)
    }
    /// Something is queued or scheduled on the fabric (see the field).
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }
}

/// The fabric: ports, cables, switches and packets in flight.
#[derive(Debug, Default)]
pub struct Fabric {
    ports: BTreeMap<PortId, FabPort>,
    next_id: u32,
    /// Wire latency added to every packet, in nanoseconds.
    pub latency_ns: u64,
    switches: Vec<(Switch, Vec<PortId>)>,
    eth_switches: Vec<(EthSwitch, Vec<PortId>)>,
    /// Switch ports with a packet waiting, in arrival order.
    switch_work: VecDeque<PortId>,
    /// Per-packet faults.
    pub faults: PacketFaults,
    capture: Option<Capture>,
    events: Vec<(u64, Event)>,
    byte_pulls: Vec<BytePull>,
    next_link: u64,
    stats: FabricStats,
    sm: Option<Box<SubnetManager>>,
    /// Packet buffers given back by receivers ([`Fabric::recycle`]).
    spare: Vec<Vec<u8>>,
    /// Packets in every port's inbound queue.
    queued: usize,
    /// A switch port's link changed since the last [`Fabric::advance`]
    /// (the switch may owe its SM a trap).
    traps_owed: bool,
    /// What the HCAs read without the lock.
    activity: Arc<Activity>,
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

    /// The signals an HCA reads without the lock (see [`Activity`]).
    pub fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }

    /// Stores [`Activity::busy`] after a change of the queues, the
    /// scheduled events or the SM.
    fn publish(&self) {
        let busy =
            self.queued != 0 || !self.events.is_empty() || self.traps_owed || self.sm.is_some();
        self.activity.busy.store(busy, Ordering::Release);
    }

    /// Moves the link epoch (every change of cabling or enables).
    fn links_changed(&self) {
        self.activity.links.fetch_add(1, Ordering::AcqRel);
    }

    fn add_port(&mut self, owner: Owner) -> PortId {
        let id = PortId(self.next_id);
        self.next_id += 1;
        self.ports.insert(id, FabPort::new(owner));
        id
    }

    /// Adds port `port` of the HCA with node GUID `node_guid`; the port
    /// starts disabled and uncabled.
    pub fn attach_hca_port(&mut self, node_guid: u64, port: u8) -> PortId {
        self.add_port(Owner::Hca { node_guid, port })
    }

    /// Adds a switch; its external ports are enabled (a switch is powered)
    /// and uncabled.
    pub fn add_switch(&mut self, sw: Switch) -> SwitchId {
        let id = SwitchId(self.switches.len());
        let mut ports = vec![PortId(u32::MAX)]; // port 0 is not on the wire
        for p in 1..=sw.nports() {
            let fp = self.add_port(Owner::Switch {
                switch: id,
                port: p,
            });
            if let Some(x) = self.ports.get_mut(&fp) {
                x.enabled = true;
                x.speeds_ext = sw.link_speeds_ext(p);
            }
            ports.push(fp);
        }
        self.switches.push((sw, ports));
        id
    }

    /// Adds an Ethernet switch; its ports are Ethernet ports, enabled and
    /// uncabled.
    pub fn add_eth_switch(&mut self, sw: EthSwitch) -> EthSwitchId {
        let id = EthSwitchId(self.eth_switches.len());
        let mut ports = vec![PortId(u32::MAX)];
        for p in 1..=sw.nports() {
            let fp = self.add_port(Owner::EthSwitch {
                switch: id,
                port: p,
            });
            if let Some(x) = self.ports.get_mut(&fp) {
                x.enabled = true;
                x.link_layer = LinkLayer::Eth;
            }
            ports.push(fp);
        }
        self.eth_switches.push((sw, ports));
        id
    }

    /// The Ethernet switch `id`.
    pub fn eth_switch(&self, id: EthSwitchId) -> Option<&EthSwitch> {
        self.eth_switches.get(id.0).map(|(s, _)| s)
    }

    /// The Ethernet switch `id`, to change (its ageing time, say).
    pub fn eth_switch_mut(&mut self, id: EthSwitchId) -> Option<&mut EthSwitch> {
        self.eth_switches.get_mut(id.0).map(|(s, _)| s)
    }

    /// The fabric port of port `port` of Ethernet switch `id`.
    pub fn eth_switch_port(&self, id: EthSwitchId, port: u8) -> Option<PortId> {
        let (_, ports) = self.eth_switches.get(id.0)?;
        ports.get(usize::from(port)).copied().filter(|_| port != 0)
    }

    /// Adds the embedded subnet manager on a node of its own (one port,
    /// enabled, uncabled; node GUID `cfg.node_guid`) and returns its port.
    /// It replaces an SM added before.
    pub fn add_sm(&mut self, cfg: SmConfig) -> PortId {
        let p = self.attach_hca_port(cfg.node_guid, 1);
        self.set_port_name(p, "sm/1");
        let _ = self.set_enabled(p, true);
        self.sm = Some(Box::new(SubnetManager::new(cfg, p)));
        self.publish();
        p
    }

    /// [`Fabric::add_sm`] with the SM's port cabled to port `port` of
    /// switch `sw` (like the SM inside a managed switch).
    pub fn add_sm_on_switch(
        &mut self,
        cfg: SmConfig,
        sw: SwitchId,
        port: u8,
    ) -> Result<PortId, FabricError> {
        let q = self
            .switch_port(sw, port)
            .ok_or(FabricError::NoSuchPort(PortId(u32::MAX)))?;
        if self.peer(q).is_some() {
            return Err(FabricError::AlreadyCabled(q));
        }
        let p = self.add_sm(cfg);
        self.connect(p, q)?;
        Ok(p)
    }

    /// [`Fabric::add_sm_on_switch`] on the first switch port without a
    /// cable (the lowest-numbered switch first): where `--sm embedded`
    /// puts the SM on a topology that did not place it.
    pub fn add_sm_on_free_port(&mut self, cfg: SmConfig) -> Result<PortId, FabricError> {
        for (j, (sw, _)) in self.switches.iter().enumerate() {
            for port in 1..=sw.nports() {
                let Some(q) = self.switch_port(SwitchId(j), port) else {
                    continue;
                };
                if self.peer(q).is_none() {
                    return self.add_sm_on_switch(cfg, SwitchId(j), port);
                }
            }
        }
        Err(FabricError::NoSuchPort(PortId(u32::MAX)))
    }

    /// The embedded SM, if there is one.
    pub fn sm(&self) -> Option<&SubnetManager> {
        self.sm.as_deref()
    }

    /// The embedded SM, to change.
    pub fn sm_mut(&mut self) -> Option<&mut SubnetManager> {
        self.sm.as_deref_mut()
    }

    /// Restarts the embedded SM: it forgets everything
    /// ([`SubnetManager::restarted`]) and sweeps again.
    pub fn restart_sm(&mut self) {
        if let Some(sm) = self.sm.as_mut() {
            **sm = sm.restarted();
        }
    }

    /// Removes the embedded SM (its port stays, dark to SMPs).
    pub fn remove_sm(&mut self) -> Option<SubnetManager> {
        let sm = self.sm.take().map(|b| *b);
        self.publish();
        sm
    }

    fn poll_sm(&mut self, now_ns: u64) -> bool {
        let Some(s) = self.sm.as_deref() else {
            return false;
        };
        let (gen_, due) = self.ports.get(&s.port()).map_or((0, false), |fp| {
            (
                fp.link_generation,
                fp.inbound.front().is_some_and(|f| f.due <= now_ns),
            )
        });
        if !s.wants_poll(now_ns, gen_, due) {
            return false;
        }
        let Some(mut sm) = self.sm.take() else {
            return false;
        };
        let did = sm.poll(self, now_ns);
        if self.sm.is_none() {
            self.sm = Some(sm);
        }
        did
    }

    /// For a node the fabric models itself (the SM): the next packet due at
    /// `p`, without advancing the fabric.
    pub(crate) fn take_due(&mut self, p: PortId, now_ns: u64) -> Option<Packet> {
        let ll = self.link_layer(p);
        self.pop_due(p, now_ns).map(|f| f.into_sealed(ll))
    }

    /// The packet at the head of `p`'s queue if it is due by `now_ns`,
    /// taken off the queue.
    fn pop_due(&mut self, p: PortId, now_ns: u64) -> Option<InFlight> {
        let q = &mut self.ports.get_mut(&p)?.inbound;
        if q.front().is_none_or(|f| f.due > now_ns) {
            return None;
        }
        let f = q.pop_front();
        self.queued = self.queued.saturating_sub(1);
        self.publish();
        f
    }

    /// For a node the fabric models itself: sends without advancing.
    pub(crate) fn send_from(&mut self, p: PortId, pkt: Packet, now_ns: u64) -> bool {
        self.send(p, pkt, now_ns, 0, false)
    }

    /// The switch `id`.
    pub fn switch(&self, id: SwitchId) -> Option<&Switch> {
        self.switches.get(id.0).map(|(s, _)| s)
    }

    /// The switch `id`, to change (tests, or a front end standing in for an
    /// SM through [`Switch::configure`]).
    pub fn switch_mut(&mut self, id: SwitchId) -> Option<&mut Switch> {
        self.switches.get_mut(id.0).map(|(s, _)| s)
    }

    /// The fabric port of external port `port` of switch `id`.
    pub fn switch_port(&self, id: SwitchId, port: u8) -> Option<PortId> {
        let (_, ports) = self.switches.get(id.0)?;
        ports.get(usize::from(port)).copied().filter(|_| port != 0)
    }

    /// What port `p` belongs to.
    pub fn owner(&self, p: PortId) -> Option<Owner> {
        self.ports.get(&p).map(|fp| fp.owner)
    }

    /// Names port `p` for the capture (`"node0/1"`).
    pub fn set_port_name(&mut self, p: PortId, name: &str) {
        if let Some(fp) = self.ports.get_mut(&p) {
            fp.name = Some(name.into());
        }
    }

    /// The name of port `p` (`"port<N>"` if none was set).
    pub fn port_name(&self, p: PortId) -> String {
        self.ports
            .get(&p)
            .and_then(|fp| fp.name.clone())
            .unwrap_or_else(|| format!("port{}", p.0))
    }

    /// Starts (or with `None` stops) capturing every packet on every cable.
    pub fn set_capture(&mut self, c: Option<Capture>) -> Option<Capture> {
        std::mem::replace(&mut self.capture, c)
    }

    /// The capture, if one is running.
    pub fn capture_mut(&mut self) -> Option<&mut Capture> {
        self.capture.as_mut()
    }

    /// Wire statistics.
    pub fn stats(&self) -> &FabricStats {
        &self.stats
    }

    /// What port `p`'s cable carries (InfiniBand unless the port was made
    /// an Ethernet port).
    pub fn link_layer(&self, p: PortId) -> LinkLayer {
        self.ports.get(&p).map_or(LinkLayer::Ib, |fp| fp.link_layer)
    }

    /// The link layer of the cable at `p`, if it has one.
    pub fn cable_link_layer(&self, p: PortId) -> Option<LinkLayer> {
        self.peer(p).map(|_| self.link_layer(p))
    }

    /// Makes port `p` an InfiniBand or an Ethernet port (before it is
    /// cabled: a cable joins two ports of one link layer).
    pub fn set_link_layer(&mut self, p: PortId, ll: LinkLayer) -> Result<(), FabricError> {
        let fp = self.ports.get_mut(&p).ok_or(FabricError::NoSuchPort(p))?;
        if fp.link_layer == ll {
            return Ok(());
        }
        if let Some(q) = fp.peer {
            return Err(FabricError::LinkLayerMismatch(p, q));
        }
        fp.link_layer = ll;
        Ok(())
    }

    /// Joins `a` and `b` with a cable.
    pub fn connect(&mut self, a: PortId, b: PortId) -> Result<(), FabricError> {
        if a == b {
            return Err(FabricError::SelfLoop(a));
        }
        if self.ports.contains_key(&a)
            && self.ports.contains_key(&b)
            && self.link_layer(a) != self.link_layer(b)
        {
            return Err(FabricError::LinkLayerMismatch(a, b));
        }
        for p in [a, b] {
            match self.ports.get(&p) {
                None => return Err(FabricError::NoSuchPort(p)),
                Some(fp) if fp.peer.is_some() => return Err(FabricError::AlreadyCabled(p)),
                Some(_) => {}
            }
        }
        let before = [self.link_up(a), self.link_up(b)];
        self.next_link += 1;
        let link = self.next_link;
        for (p, q) in [(a, b), (b, a)] {
            let fp = self.port_mut(p);
            fp.peer = Some(q);
            fp.link = link;
        }
        self.tell_switch_its_peer(a);
        self.tell_switch_its_peer(b);
        self.note_link_change(a, before[0]);
        self.note_link_change(b, before[1]);
        self.links_changed();
        self.publish();
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
            self.tell_switch_its_peer(q);
            let fp = self.port_mut(q);
            let lost = fp.inbound.len();
            fp.inbound.clear();
            self.queued = self.queued.saturating_sub(lost);
            self.stats.lost_in_flight += lost as u64;
            self.note_link_change(q, was);
        }
        self.links_changed();
        self.publish();
        Ok(())
    }

    /// Pulls the cable at `p` at time `at_ns` and, if `reinsert_at_ns` is
    /// given, plugs the same cable back at that time. Happens during
    /// [`Fabric::advance`].
    pub fn schedule_unplug(
        &mut self,
        p: PortId,
        at_ns: u64,
        reinsert_at_ns: Option<u64>,
    ) -> Result<(), FabricError> {
        let fp = self.ports.get(&p).ok_or(FabricError::NoSuchPort(p))?;
        let peer = fp.peer;
        self.events.push((at_ns, Event::Unplug(p)));
        if let (Some(t), Some(q)) = (reinsert_at_ns, peer) {
            self.events.push((t.max(at_ns), Event::Connect(p, q)));
        }
        self.events.sort_by_key(|(t, _)| *t);
        self.publish();
        Ok(())
    }

    /// Pulls the cable at `p` once `bytes` more bytes (whole packets, in
    /// either direction) have crossed it, and plugs it back
    /// `reinsert_after_ns` later if given: a fault tied to the traffic,
    /// where a fixed time would race with how fast the senders get going.
    pub fn unplug_after_bytes(
        &mut self,
        p: PortId,
        bytes: u64,
        reinsert_after_ns: Option<u64>,
    ) -> Result<(), FabricError> {
        let fp = self.ports.get(&p).ok_or(FabricError::NoSuchPort(p))?;
        let peer = fp.peer.ok_or(FabricError::NoSuchPort(p))?;
        self.byte_pulls.push(BytePull {
            port: p,
            peer,
            left: bytes,
            reinsert_after_ns,
        });
        Ok(())
    }

    /// Counts a packet of `len` bytes sent out of `p` against the pulls
    /// waiting for traffic on its cable; a pull whose count is used up is
    /// scheduled for `now_ns` (it happens on the next advance).
    fn count_for_pulls(&mut self, p: PortId, len: usize, now_ns: u64) {
        let mut i = 0;
        while i < self.byte_pulls.len() {
            let bp = &mut self.byte_pulls[i];
            if bp.port != p && bp.peer != p {
                i += 1;
                continue;
            }
            bp.left = bp.left.saturating_sub(len as u64);
            if bp.left > 0 {
                i += 1;
                continue;
            }
            let bp = self.byte_pulls.swap_remove(i);
            self.events.push((now_ns, Event::Unplug(bp.port)));
            if let Some(d) = bp.reinsert_after_ns {
                let back = Event::Connect(bp.port, bp.peer);
                self.events.push((now_ns.saturating_add(d), back));
            }
            self.events.sort_by_key(|(t, _)| *t);
        }
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
        self.links_changed();
        self.publish();
        Ok(())
    }

    /// Port `p`'s end of its cable would train to the extended link speeds
    /// `speeds` (PortInfo LinkSpeedExtEnabled): what an HCA publishes of
    /// its port. The peer reads it ([`Fabric::peer_link_speeds_ext`]); a
    /// change moves the link epoch.
    pub fn set_link_speeds_ext(&mut self, p: PortId, speeds: u8) -> Result<(), FabricError> {
        let fp = self.ports.get_mut(&p).ok_or(FabricError::NoSuchPort(p))?;
        if fp.speeds_ext == speeds {
            return Ok(());
        }
        fp.speeds_ext = speeds;
        let peer = fp.peer;
        if let Some(q) = peer {
            self.tell_switch_its_peer(q);
        }
        self.links_changed();
        Ok(())
    }

    /// The extended link speeds the other end of `p`'s cable would train
    /// to (0 without a cable).
    pub fn peer_link_speeds_ext(&self, p: PortId) -> u8 {
        self.peer(p)
            .and_then(|q| self.ports.get(&q))
            .map_or(0, |fp| fp.speeds_ext)
    }

    /// If `q` is a switch port, tells its switch what the other end of its
    /// cable would train to (0 without a cable).
    fn tell_switch_its_peer(&mut self, q: PortId) {
        let speeds = self.peer_link_speeds_ext(q);
        if let Some(Owner::Switch { switch, port }) = self.owner(q)
            && let Some((sw, _)) = self.switches.get_mut(switch.0)
        {
            sw.set_peer_speeds_ext(port, speeds);
        }
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
    /// says whether it went onto the wire (a packet a fault then loses
    /// still counts as sent: the sender cannot tell).
    pub fn transmit(&mut self, p: PortId, pkt: Packet, now_ns: u64) -> bool {
        self.advance(now_ns);
        self.send(p, pkt, now_ns, 0, false)
    }

    /// [`Fabric::transmit`] for a packet whose CRCs are owed (built by
    /// [`packet::build_owed_with`]; see "CRCs owed" above).
    pub fn transmit_owed(&mut self, p: PortId, pkt: Packet, now_ns: u64) -> bool {
        self.advance(now_ns);
        self.send(p, pkt, now_ns, 0, true)
    }

    /// A buffer for the next packet a sender builds (one a receiver gave
    /// back with [`Fabric::recycle`], so the data path does not allocate
    /// once it runs). It may hold an old packet's bytes:
    /// [`packet::build_owed_with`] overwrites what it keeps.
    pub fn take_buffer(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// Gives a received packet's buffer back for [`Fabric::take_buffer`].
    pub fn recycle(&mut self, b: Vec<u8>) {
        if self.spare.len() < MAX_SPARE && b.capacity() >= 256 {
            self.spare.push(b);
        }
    }

    fn send(&mut self, p: PortId, mut pkt: Packet, now_ns: u64, hops: u8, owed: bool) -> bool {
        if !self.link_up(p) {
            self.stats.link_down += 1;
            if let Some(Owner::Switch { switch, port }) = self.owner(p)
                && let Some((sw, _)) = self.switches.get_mut(switch.0)
            {
                sw.count_xmit_discard(port);
            }
            return false;
        }
        let Some(peer) = self.ports.get(&p).and_then(|fp| fp.peer) else {
            return false;
        };
        if self
            .ports
            .get(&peer)
            .is_some_and(|fp| fp.inbound.len() >= MAX_INBOUND)
        {
            self.stats.queue_full += 1;
            if let Some(Owner::Switch { switch, port }) = self.owner(p)
                && let Some((sw, _)) = self.switches.get_mut(switch.0)
            {
                sw.count_xmit_discard(port);
            }
            return false;
        }
        let to_hca = matches!(self.owner(peer), Some(Owner::Hca { .. }));
        let ll = self.link_layer(p);
        // Owed only while the bytes say so: a packet with real CRCs keeps
        // them and is checked at every hop and by its receiver.
        let mut owed = owed && crcs_owed(ll, &pkt.bytes);
        if owed && (!self.faults.rules.is_empty() || self.capture.is_some()) {
            // A fault may change the bytes, a capture shows them: the
            // sender's CRCs first.
            seal(ll, &mut pkt.bytes);
            owed = false;
        }
        let verdict = self
            .faults
            .apply(now_ns, p, to_hca, ll == LinkLayer::Eth, &mut pkt.bytes);
        match self.owner(p) {
            Some(Owner::Switch { switch, port }) => {
                if let Some((sw, _)) = self.switches.get_mut(switch.0) {
                    sw.count_xmit(port, pkt.bytes.len());
                }
            }
            Some(Owner::EthSwitch { switch, port }) => {
                if let Some((sw, _)) = self.eth_switches.get_mut(switch.0) {
                    sw.count_tx(port, pkt.bytes.len());
                }
            }
            _ => {}
        }
        self.stats.sent += 1;
        if !self.byte_pulls.is_empty() {
            self.count_for_pulls(p, pkt.bytes.len(), now_ns);
        }
        if verdict.drop {
            // (A pull counted above may have scheduled an event.)
            self.publish();
            return true;
        }
        if self.capture.is_some() {
            self.record(p, peer, now_ns, &pkt.bytes);
        }
        let latency = self.latency_ns;
        let q = &mut self.port_mut(peer).inbound;
        let floor = q.back().map_or(0, |f| f.due);
        let due = now_ns
            .saturating_add(latency)
            .saturating_add(verdict.delay_ns)
            .max(floor);
        q.push_back(InFlight {
            due,
            pkt,
            hops,
            owed,
        });
        self.queued += 1;
        self.publish();
        if !to_hca {
            self.switch_work.push_back(peer);
        }
        true
    }

    fn record(&mut self, from: PortId, to: PortId, now_ns: u64, bytes: &[u8]) {
        let (a, b) = if from < to { (from, to) } else { (to, from) };
        let dir = if from == a {
            Direction::AtoB
        } else {
            Direction::BtoA
        };
        let link = self.ports.get(&from).map_or(0, |fp| fp.link);
        let name = if self.capture.as_ref().is_some_and(|c| c.knows(link)) {
            String::new()
        } else {
            format!("{} <-> {}", self.port_name(a), self.port_name(b))
        };
        let ll = self.link_layer(from);
        if let Some(c) = self.capture.as_mut() {
            c.record(link, &name, dir, now_ns, bytes, ll);
        }
    }

    /// The next packet due at port `p` by `now_ns` (after the fabric has
    /// advanced to `now_ns`).
    pub fn receive(&mut self, p: PortId, now_ns: u64) -> Option<Packet> {
        self.advance(now_ns);
        let ll = self.link_layer(p);
        self.pop_due(p, now_ns).map(|f| f.into_sealed(ll))
    }

    /// [`Fabric::receive`] without sealing: the packet, and whether its
    /// CRCs are still owed (then the bytes are exactly as a model HCA
    /// built them, and only the CRC comparison may be skipped).
    pub fn receive_owed(&mut self, p: PortId, now_ns: u64) -> Option<(Packet, bool)> {
        self.advance(now_ns);
        self.pop_due(p, now_ns).map(|f| (f.pkt, f.owed))
    }

    /// The earliest time a queued packet becomes due anywhere, a
    /// scheduled cable change happens, or the embedded SM has a timer (an
    /// SMP timeout, its next sweep: with an SM on a live link there is
    /// always one).
    pub fn next_due(&self) -> Option<u64> {
        self.ports
            .values()
            .filter_map(|fp| fp.inbound.front().map(|f| f.due))
            .chain(self.events.first().map(|(t, _)| *t))
            .chain(self.sm.as_ref().and_then(|s| s.next_due()))
            .min()
    }

    /// Brings the fabric to time `now_ns`: scheduled cable changes happen,
    /// the embedded SM is polled (before and after the switches), and
    /// switches process the packets due by then (bounded by
    /// [`MAX_SWITCH_WORK`] per call).
    pub fn advance(&mut self, now_ns: u64) {
        while self.events.first().is_some_and(|(t, _)| *t <= now_ns) {
            let (_, ev) = self.events.remove(0);
            let _ = match ev {
                Event::Unplug(p) => self.unplug(p),
                Event::Connect(a, b) => self.connect(a, b),
                Event::Retrained(p) => {
                    let wanted = match self.owner(p) {
                        Some(Owner::Switch { switch, port }) => {
                            self.switch(switch).is_some_and(|sw| sw.port_enabled(port))
                        }
                        _ => false,
                    };
                    if wanted {
                        self.set_enabled(p, true)
                    } else {
                        Ok(())
                    }
                }
            };
        }
        self.send_traps(now_ns);
        self.poll_sm(now_ns);
        if self.switch_work_until(now_ns) {
            // The switches may have answered the SM.
            self.poll_sm(now_ns);
        }
        self.publish();
    }

    /// Processes the switch packets due; says whether there were any.
    fn switch_work_until(&mut self, now_ns: u64) -> bool {
        let mut budget = MAX_SWITCH_WORK;
        while budget > 0 {
            // The first waiting switch port whose head packet is due (a
            // packet delayed on one cable does not hold up the others);
            // entries of emptied queues (a pulled cable) go too.
            let ports = &self.ports;
            let pos = self.switch_work.iter().position(|sp| {
                ports
                    .get(sp)
                    .is_none_or(|fp| fp.inbound.front().is_none_or(|f| f.due <= now_ns))
            });
            let Some(sp) = pos.and_then(|i| self.switch_work.remove(i)) else {
                break;
            };
            let Some(f) = self
                .ports
                .get_mut(&sp)
                .and_then(|fp| fp.inbound.pop_front())
            else {
                continue;
            };
            self.queued = self.queued.saturating_sub(1);
            budget -= 1;
            match self.owner(sp) {
                Some(Owner::Switch { switch, port }) => self.switch_step(switch, port, f),
                Some(Owner::EthSwitch { switch, port }) => self.eth_switch_step(switch, port, f),
                _ => {}
            }
        }
        budget != MAX_SWITCH_WORK
    }

    /// Switches whose ports changed state send their SM Trap 128.
    fn send_traps(&mut self, now_ns: u64) {
        self.traps_owed = false;
        for j in 0..self.switches.len() {
            if let Some((e, pkt)) = self.switches[j].0.take_trap()
                && let Some(out) = self.switch_port(SwitchId(j), e)
            {
                self.send(out, pkt, now_ns, 0, false);
            }
        }
    }

    fn switch_step(&mut self, id: SwitchId, in_port: u8, f: InFlight) {
        let Some((sw, _)) = self.switches.get_mut(id.0) else {
            return;
        };
        let smp = f.pkt.vl() == Some(15);
        sw.set_time(f.due);
        let mut f = f;
        if f.owed && !sw.only_forwards(&f.pkt.bytes) {
            // The switch's SMA or PMA reads it: the sender's CRCs first.
            let _ = packet::seal_owed(&mut f.pkt.bytes);
            f.owed = false;
        }
        let action = if f.hops >= MAX_HOPS {
            switch::Action::Drop("looping: too many switch hops")
        } else {
            sw.receive_crc_owed(in_port, f.pkt, f.owed)
        };
        if smp {
            self.sync_switch_enables(id, f.due);
        }
        match action {
            switch::Action::Send(e, pkt) => {
                if let Some(out) = self.switch_port(id, e) {
                    self.send(out, pkt, f.due, f.hops.saturating_add(1), f.owed);
                }
            }
            switch::Action::Replicate(copies) => {
                for (e, pkt) in copies {
                    if let Some(out) = self.switch_port(id, e) {
                        self.send(out, pkt, f.due, f.hops.saturating_add(1), f.owed);
                    }
                }
            }
            switch::Action::Drop(why) => {
                *self.stats.switch_drops.entry(why).or_default() += 1;
            }
        }
    }

    /// A frame at port `in_port` of Ethernet switch `id`: forwarded,
    /// flooded or dropped ([`EthSwitch::receive`]); copies keep the
    /// frame's owed state (nothing changed its bytes).
    fn eth_switch_step(&mut self, id: EthSwitchId, in_port: u8, f: InFlight) {
        let Some((_, ports)) = self.eth_switches.get(id.0) else {
            return;
        };
        let live: Vec<bool> = ports.iter().map(|p| self.link_up(*p)).collect();
        let Some((sw, _)) = self.eth_switches.get_mut(id.0) else {
            return;
        };
        let action = if f.hops >= MAX_HOPS {
            EthAction::Drop("looping: too many switch hops")
        } else {
            sw.receive(in_port, &f.pkt.bytes, f.owed, f.due, |p| {
                live.get(usize::from(p)).copied().unwrap_or(false)
            })
        };
        match action {
            EthAction::Forward(out) => {
                let n = out.len();
                let mut pkt = Some(f.pkt);
                for (k, e) in out.into_iter().enumerate() {
                    let Some(fp) = self.eth_switch_port(id, e) else {
                        continue;
                    };
                    // The last copy takes the frame itself.
                    let copy = if k + 1 == n { pkt.take() } else { pkt.clone() };
                    if let Some(c) = copy {
                        self.send(fp, c, f.due, f.hops.saturating_add(1), f.owed);
                    }
                }
            }
            EthAction::Drop(why) => {
                *self.stats.switch_drops.entry(why).or_default() += 1;
            }
        }
    }

    /// An SMP may have disabled, enabled or reset switch ports (PortInfo
    /// PortPhysicalState); the wire follows. A reset takes the link down
    /// now and enables it again [`RETRAIN_NS`] later.
    fn sync_switch_enables(&mut self, id: SwitchId, now_ns: u64) {
        let Some((sw, ports)) = self.switches.get_mut(id.0) else {
            return;
        };
        let mut retrain = Vec::new();
        for p in 1..=sw.nports() {
            if sw.take_retrain(p)
                && let Some(fp) = ports.get(usize::from(p))
            {
                retrain.push(*fp);
            }
        }
        let changes: Vec<(PortId, bool)> = (1..=sw.nports())
            .filter_map(|p| {
                let fp = *ports.get(usize::from(p))?;
                let want = sw.port_enabled(p);
                (self.ports.get(&fp)?.enabled != want).then_some((fp, want))
            })
            .collect();
        for (fp, en) in changes {
            let _ = self.set_enabled(fp, en);
        }
        for fp in retrain {
            let _ = self.set_enabled(fp, false);
            self.events
                .push((now_ns.saturating_add(RETRAIN_NS), Event::Retrained(fp)));
            self.events.sort_by_key(|(t, _)| *t);
        }
        // LinkSpeedExtEnabled as the SMA now has it, for the far ends.
        let speeds: Vec<(PortId, u8)> = match self.switches.get(id.0) {
            Some((sw, ports)) => (1..=sw.nports())
                .filter_map(|p| Some((*ports.get(usize::from(p))?, sw.link_speeds_ext(p))))
                .collect(),
            None => Vec::new(),
        };
        for (fp, s) in speeds {
            let _ = self.set_link_speeds_ext(fp, s);
        }
        self.publish();
    }

    /// Programs every switch as an SM's min-hop routing would, without
    /// SMPs: switch j gets LID `first_switch_lid + j`, every switch an LFT
    /// entry for each `(HCA port, LID)` in `hca_lids` and for every switch
    /// LID along a shortest path over links that are up, and its cabled
    /// ports Active. A stand-in for tests and for running without an SM;
    /// HCA ports are not touched (their SMA moves them). Returns the
    /// switch LIDs.
    pub fn route_min_hop(
        &mut self,
        hca_lids: &[(PortId, u16)],
        first_switch_lid: u16,
    ) -> Result<Vec<u16>, String> {
        let nsw = self.switches.len();
        let sw_lids: Vec<u16> = (0..nsw)
            .map(|j| {
                first_switch_lid
                    .checked_add(j as u16)
                    .filter(|l| *l != 0 && *l < 0xc000)
            })
            .collect::<Option<_>>()
            .ok_or("switch LIDs out of the unicast range")?;
        for (p, l) in hca_lids {
            if *l == 0 || *l >= 0xc000 {
                return Err(format!("LID {l:#x} of port {} is not unicast", p.0));
            }
            if sw_lids.contains(l) || hca_lids.iter().filter(|(_, m)| m == l).count() > 1 {
                return Err(format!("LID {l} given twice"));
            }
        }
        // Switch-to-switch cables that are up: (switch, its port) -> (switch, its port).
        let peer_switch = |f: &Fabric, s: usize, port: u8| -> Option<(usize, u8)> {
            let fp = f.switch_port(SwitchId(s), port)?;
            if !f.link_up(fp) {
                return None;
            }
            match f.owner(f.peer(fp)?)? {
                Owner::Switch { switch, port } => Some((switch.0, port)),
                Owner::Hca { .. } | Owner::EthSwitch { .. } => None,
            }
        };
        let mut routes: Vec<Vec<(u16, u8)>> = vec![Vec::new(); nsw];
        // Destinations: (LID, the switch next to it, the port there).
        let mut dests: Vec<(u16, usize, u8)> = Vec::new();
        for &(p, l) in hca_lids {
            if let Some(Owner::Switch { switch, port }) = self.peer(p).and_then(|q| self.owner(q))
                && self.link_up(p)
            {
                dests.push((l, switch.0, port));
            }
        }
        for (j, l) in sw_lids.iter().enumerate() {
            dests.push((*l, j, 0));
        }
        for (lid, s0, port0) in dests {
            let mut seen = vec![false; nsw];
            seen[s0] = true;
            routes[s0].push((lid, port0));
            let mut q = VecDeque::from([s0]);
            while let Some(s) = q.pop_front() {
                let n = self.switches[s].0.nports();
                for port in 1..=n {
                    if let Some((t, tport)) = peer_switch(self, s, port)
                        && !seen[t]
                    {
                        seen[t] = true;
                        routes[t].push((lid, tport));
                        q.push_back(t);
                    }
                }
            }
        }
        for (j, r) in routes.iter().enumerate() {
            self.switches[j].0.configure(sw_lids[j], r);
        }
        Ok(sw_lids)
    }

    fn port_mut(&mut self, p: PortId) -> &mut FabPort {
        // Callers checked that `p` exists; a missing port is a model bug
        // that must not take the process down, so it gets a scratch port.
        self.ports.entry(p).or_insert_with(|| {
            FabPort::new(Owner::Hca {
                node_guid: 0,
                port: 0,
            })
        })
    }

    fn note_link_change(&mut self, p: PortId, before: bool) {
        let now = self.link_up(p);
        if now != before {
            let fp = self.port_mut(p);
            fp.link_generation += 1;
            if !now {
                let lost = fp.inbound.len();
                fp.inbound.clear();
                self.queued = self.queued.saturating_sub(lost);
                self.stats.lost_in_flight += lost as u64;
            }
            if let Some(Owner::Switch { switch, port }) = self.owner(p)
                && let Some((sw, _)) = self.switches.get_mut(switch.0)
            {
                sw.link_changed(port, now);
                self.traps_owed = true;
            }
            // An Ethernet switch forgets what it learned on a port whose
            // link went down.
            if !now
                && let Some(Owner::EthSwitch { switch, port }) = self.owner(p)
                && let Some((sw, _)) = self.eth_switches.get_mut(switch.0)
            {
                sw.flush_port(port);
            }
        }
    }
}

#[cfg(test)]
mod tests;
