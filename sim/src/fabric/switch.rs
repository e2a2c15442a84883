//! A SwitchX-class InfiniBand switch.
//!
//! A SwitchX-class InfiniBand switch (vendor 0x02c9, device 0xc738, as
//! ibsim's examples use; 36 ports by default): its SMA on port 0
//! (NodeInfo, NodeDescription, SwitchInfo, PortInfo of every port,
//! P_KeyTable of port 0 and the partition enforcement table of every
//! external port, GUIDInfo, LinearForwardingTable and
//! MulticastForwardingTable get/set, Mellanox's ExtendedPortInfo 0xFF90),
//! directed-route SMP processing at each hop (IBTA vol. 1 14.2.2, C14-9
//! and C14-13, with a LID-routed start whose response goes back by LID to
//! the DrSLID), LID routing by the linear forwarding table, multicast
//! replication by the multicast one, partition enforcement and raw
//! filtering on external ports as the SM turns them on, M_Key protection
//! levels 1 and 2 with the lease period (IBTA 14.2.4.2: a failed check
//! starts the lease timer, an SMP with the key stops it, and when it runs
//! out the protection bits fall to 0), 4x FDR links (PortInfo's extended
//! speeds: every external port supports and enables FDR, as an SX6036
//! does, and runs it while its link is up and the far end has it too),
//! and a PMA (ClassPortInfo, PortCounters,
//! PortCountersExtended) per port; SL-to-VL mapping and VL arbitration
//! (their tables are kept and reported, not applied), random forwarding
//! tables, FDR10 (ExtendedPortInfo reports none, as ibsim does by
//! default), traps other than Trap 128 (sent once per port state change,
//! not repeated) and a LID-routed end of a directed route (a
//! non-permissive DrDLID) are not modelled.
//!
//! Written from the IBTA attribute layouts (14.2.5 and 16.1.3), with
//! ibsim and OpenSM as facts; the directed-route rules follow the spec's
//! numbered compliance statements, which Linux's `smi.c` implements for
//! the same purpose.
//!
//! Port states: an external port is Down while its physical link is down
//! and becomes Init when the link comes up; only an SMP (SubnSet
//! PortInfo) moves it to Armed and Active, as on a real switch. SMPs
//! (VL15) cross ports in any state with the link up; other packets enter
//! only through Armed or Active ports and leave only through Active ones
//! (else PortXmitDiscards on the egress port). Base port 0 has no link:
//! it is Initialize until the SM gives the switch a LID and Active after
//! (ibsim reports it so). PortPhysicalState Disabled takes a port's link
//! down (the peer sees its cable go dark) until a Set of Polling; Polling
//! on a live link retrains it (down, then up [`super::RETRAIN_NS`]
//! later), as `ibportstate disable`, `enable` and `reset` do.
//!
//! Counters (PortCounters): PortRcvPkts/PortRcvData for every packet received (data
//! in 4-byte words, LRH to ICRC), PortXmitPkts/Data for every packet sent; a bad
//! VCRC, a wrong LRH length, a VL15 packet that is not an SMP or a permissive DLID
//! off VL15 counts PortRcvErrors (a switch reads only the LRH and VCRC of a packet
//! it forwards, so other transport-level faults reach the receiving HCA), and so
//! does a bad ICRC on a packet the SMA or PMA takes (port 0 is its end port); a
//! packet said to owe its CRCs is checked unless it provably does
//! ([`Switch::receive_crc_owed`]); an unknown or unroutable DLID counts
//! PortRcvSwitchRelayErrors on the ingress port, and so does a multicast
//! LID without an entry; a P_Key refused by partition enforcement (or a
//! raw packet filtered) counts PortRcvConstraintErrors on the ingress
//! port or PortXmitConstraintErrors on the egress one; an SMP the SMI discards
//! (bad hop pointer, bad path, unsupported LID-routed DR part) counts
//! VL15Dropped; a packet whose egress link is down or not Active counts
//! PortXmitDiscards (so does a full queue at the far end); a link going
//! down counts LinkDownedCounter on the switch port.

use super::Packet;
use super::{LogicalState, PhysicalState};
use crate::fabric::packet::{
    self, Bth, Deth, GSI_QKEY, Headers, Lrh, MAD_LEN, MadHdr, PERMISSIVE_LID, Smp, attr,
    mad_status, method, mgmt_class,
};

/// The Notice attribute (traps).
const ATTR_NOTICE: u16 = 0x0002;

/// Mellanox's OUI (NodeInfo VendorID).
pub const VENDOR_MELLANOX: u32 = 0x0002c9;
/// SwitchX device id (as ibsim's examples).
pub const DEVICE_SWITCHX: u16 = 0xc738;
/// Ports of a SwitchX.
pub const SWITCHX_PORTS: u8 = 36;
/// Linear forwarding table capacity (unicast LIDs).
pub const LFT_CAP: usize = 0xc000;
/// P_Key table entries of port 0.
pub const PKEY_CAP: usize = 32;
/// An LFT entry with no port.
pub const LFT_NONE: u8 = 0xff;
/// Multicast forwarding table capacity (MLIDs from 0xC000; ibsim's).
pub const MCAST_CAP: usize = 1024;
/// The first multicast LID.
pub const MLID_BASE: u16 = 0xc000;
/// P_Key entries of each external port's partition enforcement table
/// (SwitchInfo PartitionEnforcementCap; ibsim's).
pub const PART_ENFORCE_CAP: usize = 64;
/// PortInfo CapabilityMask of port 0, as ibsim answers for a switch:
/// IsTrapSupported, IsSLMappingSupported, IsExtendedSpeedsSupported,
/// IsCapabilityMask2Supported (external ports report 0).
pub const PORT0_CAP_MASK: u32 = 0xc048;
/// LinkSpeedExtSupported of every external port (IBTA 14.2.5.6; a SwitchX
/// SX6036 is FDR: bit 0, 14.0625 Gb/s a lane).
pub const LINK_SPEEDS_EXT_SUPPORTED: u8 = 0x1;
/// PortInfo byte 43 (low nibble): PartitionEnforcementInbound.
const ENFORCE_IN: u8 = 0x8;
/// PartitionEnforcementOutbound.
const ENFORCE_OUT: u8 = 0x4;
/// FilterRawInbound.
const FILTER_RAW_IN: u8 = 0x2;
/// FilterRawOutbound.
const FILTER_RAW_OUT: u8 = 0x1;

/// Why a packet for port 0 with a bad ICRC was dropped.
const BAD_ICRC: &str = "bad ICRC on a packet for the switch's SMA or PMA";

/// PMA PortCounters and PortCountersExtended of one switch port. Kept
/// 64-bit; PortCounters reports them saturated at their field widths.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// SymbolErrorCounter.
    pub symbol_errors: u64,
    /// LinkDownedCounter.
    pub link_downed: u64,
    /// PortRcvErrors.
    pub rcv_errors: u64,
    /// PortRcvSwitchRelayErrors.
    pub rcv_switch_relay_errors: u64,
    /// PortXmitDiscards.
    pub xmit_discards: u64,
    /// VL15Dropped.
    pub vl15_dropped: u64,
    /// PortXmitConstraintErrors (outbound partition enforcement).
    pub xmit_constraint_errors: u64,
    /// PortRcvConstraintErrors (inbound partition enforcement, raw
    /// filtering).
    pub rcv_constraint_errors: u64,
    /// PortXmitData (4-byte words).
    pub xmit_data: u64,
    /// PortRcvData (4-byte words).
    pub rcv_data: u64,
    /// PortXmitPkts.
    pub xmit_pkts: u64,
    /// PortRcvPkts.
    pub rcv_pkts: u64,
}

impl PortCounters {
    fn add(&mut self, o: &PortCounters) {
        self.symbol_errors += o.symbol_errors;
        self.link_downed += o.link_downed;
        self.rcv_errors += o.rcv_errors;
        self.rcv_switch_relay_errors += o.rcv_switch_relay_errors;
        self.xmit_discards += o.xmit_discards;
        self.vl15_dropped += o.vl15_dropped;
        self.xmit_constraint_errors += o.xmit_constraint_errors;
        self.rcv_constraint_errors += o.rcv_constraint_errors;
        self.xmit_data += o.xmit_data;
        self.rcv_data += o.rcv_data;
        self.xmit_pkts += o.xmit_pkts;
        self.rcv_pkts += o.rcv_pkts;
    }
}

/// One port of the switch (port 0 is the management port).
#[derive(Debug, Clone)]
pub struct SwitchPort {
    /// Logical state.
    pub state: LogicalState,
    /// Physical state.
    pub phys: PhysicalState,
    /// Disabled by SubnSet PortInfo (PortPhysicalState 3).
    pub disabled: bool,
    /// Neighbor MTU (PortInfo encoding).
    pub neighbor_mtu: u8,
    /// Operational VLs.
    pub op_vls: u8,
    /// Counters.
    pub counters: PortCounters,
    /// Partition enforcement and raw filtering (PortInfo byte 43, low
    /// nibble), as the SM set them.
    pub enforce: u8,
    /// The partition enforcement table (SwitchInfo
    /// PartitionEnforcementCap entries).
    pub pkeys: [u16; PART_ENFORCE_CAP],
    /// Mellanox ExtendedPortInfo StateChangeEnable.
    pub mlnx_state_change_enable: u8,
    /// Mellanox ExtendedPortInfo LinkSpeedEnabled.
    pub mlnx_speed_enabled: u8,
    /// PortInfo LinkSpeedExtEnabled (external ports; the SM may narrow it).
    pub speeds_ext_enabled: u8,
    /// The extended speeds the far end of the cable would train to, as the
    /// fabric last said (0 without a cable).
    peer_speeds_ext: u8,
    /// SubnSet(PortInfo) asked an enabled port with its link up for
    /// PortPhysicalState Polling: the fabric retrains the link (down, then
    /// up again).
    retrain: bool,
}

impl SwitchPort {
    fn new(port0: bool) -> SwitchPort {
        SwitchPort {
            state: if port0 {
                LogicalState::Init
            } else {
                LogicalState::Down
            },
            phys: if port0 {
                PhysicalState::LinkUp
            } else {
                PhysicalState::Polling
            },
            disabled: false,
            neighbor_mtu: 5,
            op_vls: 4,
            counters: PortCounters::default(),
            enforce: 0,
            pkeys: {
                let mut k = [0u16; PART_ENFORCE_CAP];
                k[0] = 0xffff;
                k
            },
            mlnx_state_change_enable: 0,
            mlnx_speed_enabled: 0,
            speeds_ext_enabled: if port0 { 0 } else { LINK_SPEEDS_EXT_SUPPORTED },
            peer_speeds_ext: 0,
            retrain: false,
        }
    }
}

/// What the switch does with a packet it received.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this packet out of this port.
    Send(u8, Packet),
    /// Send a copy out of each of these ports (a multicast packet).
    Replicate(Vec<(u8, Packet)>),
    /// Dropped (counted), for this reason.
    Drop(&'static str),
}

/// A switch.
#[derive(Debug, Clone)]
pub struct Switch {
    /// NodeDescription.
    pub description: String,
    /// NodeGUID (also the port GUID of port 0).
    pub node_guid: u64,
    /// SystemImageGUID.
    pub sys_image_guid: u64,
    /// NodeInfo VendorID.
    pub vendor_id: u32,
    /// NodeInfo DeviceID.
    pub device_id: u16,
    /// NodeInfo Revision.
    pub revision: u32,
    ports: Vec<SwitchPort>,
    lft: Vec<u8>,
    lft_top: u16,
    /// MulticastForwardingTable: per MLID, the port mask in 16-port
    /// pieces (`mft_positions` of them).
    mft: Vec<u16>,
    mft_positions: usize,
    mft_top: u16,
    pkeys: [u16; PKEY_CAP],
    /// SLtoVLMappingTable per (input port, output port), as written.
    sl2vl: std::collections::BTreeMap<(u8, u8), [u8; 8]>,
    /// VLArbitrationTable blocks 1-4 per port, as written.
    vlarb: std::collections::BTreeMap<(u8, u8), [u8; 64]>,
    port_state_change: bool,
    /// A port changed state since the last trap (Trap 128 owed to the SM).
    trap_owed: bool,
    trap_tid: u64,
    life_time: u8,
    // Port 0's subnet attributes.
    lid: u16,
    lmc: u8,
    sm_lid: u16,
    sm_sl: u8,
    mkey: u64,
    mkey_protect: u8,
    mkey_lease: u16,
    gid_prefix: u64,
    subnet_timeout: u8,
    mkey_violations: u16,
    /// The M_Key lease timer (IBTA 14.2.4.2): when it runs out (fabric
    /// time, nanoseconds) the protection bits fall to 0. Started by a
    /// failed M_Key check while the lease period is not 0, stopped by an
    /// SMP with the key.
    mkey_lease_due: Option<u64>,
    /// The fabric's time as of the packet being processed
    /// ([`Switch::set_time`]).
    now_ns: u64,
}

impl Switch {
    /// A switch with `nports` external ports (1..=254), all Down, an empty
    /// LFT, LID 0 and P_Key table entry 0 = 0xFFFF.
    pub fn new(description: &str, node_guid: u64, nports: u8) -> Switch {
        let n = nports.clamp(1, 254);
        let mut pkeys = [0u16; PKEY_CAP];
        pkeys[0] = 0xffff;
        Switch {
            description: description.into(),
            node_guid,
            sys_image_guid: node_guid,
            vendor_id: VENDOR_MELLANOX,
            device_id: DEVICE_SWITCHX,
            revision: 0xa1,
            ports: (0..=n).map(|i| SwitchPort::new(i == 0)).collect(),
            lft: vec![LFT_NONE; LFT_CAP],
            lft_top: 0,
            mft: vec![0; MCAST_CAP * (usize::from(n) / 16 + 1)],
            mft_positions: usize::from(n) / 16 + 1,
            mft_top: 0,
            pkeys,
            sl2vl: std::collections::BTreeMap::new(),
            vlarb: std::collections::BTreeMap::new(),
            port_state_change: false,
            trap_owed: false,
            trap_tid: 0,
            life_time: 0x12,
            lid: 0,
            lmc: 0,
            sm_lid: 0,
            sm_sl: 0,
            mkey: 0,
            mkey_protect: 0,
            mkey_lease: 0,
            gid_prefix: 0xfe80_0000_0000_0000,
            subnet_timeout: 0,
            mkey_violations: 0,
            mkey_lease_due: None,
            now_ns: 0,
        }
    }

    /// Number of external ports.
    pub fn nports(&self) -> u8 {
        (self.ports.len() - 1) as u8
    }

    /// Port `p` (0 = management port).
    pub fn port(&self, p: u8) -> Option<&SwitchPort> {
        self.ports.get(usize::from(p))
    }

    /// The counters of port `p`.
    pub fn counters(&self, p: u8) -> PortCounters {
        self.port(p).map(|sp| sp.counters).unwrap_or_default()
    }

    /// The switch's LID (PortInfo of port 0).
    pub fn lid(&self) -> u16 {
        self.lid
    }

    /// The LFT entry for `lid` ([`LFT_NONE`] if unset).
    pub fn lft(&self, lid: u16) -> u8 {
        self.lft.get(usize::from(lid)).copied().unwrap_or(LFT_NONE)
    }

    /// LinearFDBTop.
    pub fn lft_top(&self) -> u16 {
        self.lft_top
    }

    /// The ports the multicast forwarding table sends MLID `mlid` to
    /// (empty for an MLID without an entry or outside the table).
    pub fn mft_ports(&self, mlid: u16) -> Vec<u8> {
        let Some(idx) = mlid.checked_sub(MLID_BASE).map(usize::from) else {
            return Vec::new();
        };
        if idx >= MCAST_CAP {
            return Vec::new();
        }
        let n = usize::from(self.nports());
        (0..self.mft_positions)
            .flat_map(|pos| {
                let mask = self.mft[idx * self.mft_positions + pos];
                (0..16)
                    .filter(move |b| mask & (1 << b) != 0)
                    .map(move |b| pos * 16 + b)
            })
            .filter(|&p| p <= n)
            .map(|p| p as u8)
            .collect()
    }

    /// MulticastFDBTop (0: not set, the whole table applies).
    pub fn mft_top(&self) -> u16 {
        self.mft_top
    }

    /// The fabric's time is now `now_ns` (it calls this before handing the
    /// switch a packet): an M_Key lease timer that ran out by then drops
    /// the protection bits to 0 (IBTA 14.2.4.2), so the SM can read the
    /// key again.
    pub fn set_time(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        if self.mkey_lease_due.is_some_and(|due| due <= self.now_ns) {
            self.mkey_lease_due = None;
            self.mkey_protect = 0;
        }
    }

    /// M_KeyProtectBits of port 0 (the switch's one M_Key).
    pub fn mkey_protect(&self) -> u8 {
        self.mkey_protect
    }

    /// Whether the physical link of port `p` is up.
    pub fn link_up(&self, p: u8) -> bool {
        self.port(p)
            .is_some_and(|sp| sp.phys == PhysicalState::LinkUp)
    }

    /// The extended link speeds external port `p` would train to
    /// (LinkSpeedExtEnabled; 0 for port 0, which has no link).
    pub fn link_speeds_ext(&self, p: u8) -> u8 {
        match self.port(p) {
            Some(sp) if p != 0 => sp.speeds_ext_enabled,
            _ => 0,
        }
    }

    /// The fabric tells the switch what the far end of port `p`'s cable
    /// would train to.
    pub(crate) fn set_peer_speeds_ext(&mut self, p: u8, speeds: u8) {
        if let Some(sp) = self.ports.get_mut(usize::from(p))
            && p != 0
        {
            sp.peer_speeds_ext = speeds;
        }
    }

    /// LinkSpeedExtActive of port `p`: the fastest extended speed both
    /// ends of its live link have (0: none, the link runs at QDR).
    pub fn link_speed_ext_active(&self, p: u8) -> u8 {
        match self.port(p) {
            Some(sp) if p != 0 && sp.phys == PhysicalState::LinkUp => {
                super::link_speed_ext_active(sp.speeds_ext_enabled, sp.peer_speeds_ext)
            }
            _ => 0,
        }
    }

    /// Whether port `p` is enabled (not disabled by an SMP).
    pub fn port_enabled(&self, p: u8) -> bool {
        self.port(p).is_some_and(|sp| !sp.disabled)
    }

    /// Whether an SMP asked port `p`'s link to retrain (PortPhysicalState
    /// Polling on a live link); the flag is taken.
    pub(crate) fn take_retrain(&mut self, p: u8) -> bool {
        self.ports
            .get_mut(usize::from(p))
            .is_some_and(|sp| std::mem::take(&mut sp.retrain))
    }

    /// The fabric tells the switch that the physical link of port `p` went
    /// up or down.
    pub(crate) fn link_changed(&mut self, p: u8, up: bool) {
        let Some(sp) = self.ports.get_mut(usize::from(p)) else {
            return;
        };
        if p == 0 {
            return;
        }
        let before = sp.state;
        if up {
            sp.phys = PhysicalState::LinkUp;
            sp.state = LogicalState::Init;
        } else {
            if sp.phys == PhysicalState::LinkUp {
                sp.counters.link_downed += 1;
            }
            sp.phys = if sp.disabled {
                PhysicalState::Disabled
            } else {
                PhysicalState::Polling
            };
            sp.state = LogicalState::Down;
        }
        if before != sp.state {
            self.port_state_change = true;
            self.trap_owed = true;
        }
    }

    /// The Trap 128 (PortStateChange, IBTA 14.2.5.1 table 118) this
    /// switch owes its SM after a port's link went up or down: a
    /// LID-routed SubnTrap(Notice) from the switch's LID to the SM's LID,
    /// and the port it leaves by. Sent once; there is no repeat until
    /// TrapRepress. `None` while the switch has no LID, SM LID or route.
    pub(crate) fn take_trap(&mut self) -> Option<(u8, Packet)> {
        if !std::mem::take(&mut self.trap_owed) || self.lid == 0 || self.sm_lid == 0 {
            return None;
        }
        let e = self
            .route(self.sm_lid)
            .filter(|&e| e != 0 && self.link_up(e))?;
        self.trap_tid = self.trap_tid.wrapping_add(1);
        let mut smp = Smp::lid_routed(self.trap_tid, method::TRAP, ATTR_NOTICE, 0);
        let d = &mut smp.data;
        d[0] = 0x80 | 1; // IsGeneric, Type 1 (urgent)
        d[1..4].copy_from_slice(&[0, 0, 2]); // ProducerType: switch
        d[4..6].copy_from_slice(&128u16.to_be_bytes()); // TrapNumber
        d[6..8].copy_from_slice(&self.lid.to_be_bytes()); // IssuerLID
        d[10..12].copy_from_slice(&self.lid.to_be_bytes()); // DataDetails: LIDADDR
        let h = packet::mad_headers(self.sm_lid, self.lid, 0, 0, packet::DEFAULT_PKEY);
        match self.emit(e, &h, &smp.to_bytes()) {
            Action::Send(e, p) => Some((e, p)),
            Action::Replicate(_) | Action::Drop(_) => None,
        }
    }

    /// Counts a packet of `len` bytes (LRH..VCRC) sent out of port `p`.
    pub(crate) fn count_xmit(&mut self, p: u8, len: usize) {
        if let Some(sp) = self.ports.get_mut(usize::from(p)) {
            sp.counters.xmit_pkts += 1;
            sp.counters.xmit_data += words(len);
        }
    }

    /// Counts a packet dropped at egress port `p`.
    pub(crate) fn count_xmit_discard(&mut self, p: u8) {
        if let Some(sp) = self.ports.get_mut(usize::from(p)) {
            sp.counters.xmit_discards += 1;
        }
    }

    /// A test and front-end helper standing in for what a subnet manager
    /// sets through SMPs: the switch LID, LFT entries and every port with
    /// its link up made Active. Tests of the SMA itself use SMPs instead.
    pub fn configure(&mut self, lid: u16, routes: &[(u16, u8)]) {
        self.lid = lid;
        for &(dlid, port) in routes {
            if let Some(e) = self.lft.get_mut(usize::from(dlid)) {
                *e = port;
                self.lft_top = self.lft_top.max(dlid);
            }
        }
        for sp in &mut self.ports {
            if sp.phys == PhysicalState::LinkUp {
                sp.state = LogicalState::Active;
            }
        }
    }

    fn is_own_lid(&self, dlid: u16) -> bool {
        self.lid != 0 && dlid >= self.lid && u32::from(dlid) < u32::from(self.lid) + (1 << self.lmc)
    }

    /// The egress port for a LID-routed packet, if the LFT has one.
    fn route(&self, dlid: u16) -> Option<u8> {
        if dlid == 0 || dlid >= 0xc000 || dlid > self.lft_top {
            return None;
        }
        let e = self.lft(dlid);
        (e == 0 || (e != LFT_NONE && e <= self.nports())).then_some(e)
    }

    fn ingress(&mut self, p: u8) -> &mut PortCounters {
        let i = usize::from(p).min(self.ports.len() - 1);
        &mut self.ports[i].counters
    }

    /// Processes a packet received on external port `in_port`.
    pub fn receive(&mut self, in_port: u8, pkt: Packet) -> Action {
        self.receive_crc_owed(in_port, pkt, false)
    }

    /// Whether this switch would only forward `bytes` (a data packet, not
    /// VL15, not for the permissive LID or the switch's own LID), reading
    /// nothing beyond the LRH: then a packet whose CRCs are owed may pass
    /// without them (`crate::fabric`, "CRCs owed").
    pub fn only_forwards(&self, bytes: &[u8]) -> bool {
        match Lrh::parse(bytes) {
            Ok(l) => l.vl != 15 && l.dlid != PERMISSIVE_LID && !self.is_own_lid(l.dlid),
            Err(_) => false,
        }
    }

    /// [`Switch::receive`] for a packet its sender says owes its CRCs
    /// (`crc_owed`; `crate::fabric`, "CRCs owed"). The claim is not taken
    /// on trust: it holds only while the bytes still carry the placeholders
    /// [`packet::build_owed_with`] leaves ([`packet::crcs_owed`]); a packet
    /// with real CRCs is checked like any other, so a damaged one is
    /// dropped and counted (PortRcvErrors). A packet that does owe its CRCs
    /// and that this switch only forwards skips the VCRC comparison alone
    /// (there is no VCRC yet, and nothing changed the bytes since they were
    /// built); one its SMA or PMA takes gets its CRCs computed first and is
    /// then checked as every packet port 0 takes.
    pub fn receive_crc_owed(&mut self, in_port: u8, mut pkt: Packet, crc_owed: bool) -> Action {
        if in_port == 0 || in_port > self.nports() {
            return Action::Drop("no such ingress port");
        }
        {
            let c = self.ingress(in_port);
            c.rcv_pkts += 1;
            c.rcv_data += words(pkt.bytes.len());
        }
        let mut owed = crc_owed && packet::crcs_owed(&pkt.bytes);
        if owed && !self.only_forwards(&pkt.bytes) {
            let _ = packet::seal_owed(&mut pkt.bytes);
            owed = false;
        }
        // Link level, at every hop: LRH version, packet length, VCRC. A
        // switch reads no further to forward a packet.
        let lrh = match link_check(&pkt.bytes, !owed) {
            Ok(l) => l,
            Err(_) => {
                self.ingress(in_port).rcv_errors += 1;
                return Action::Drop("malformed link packet or bad VCRC");
            }
        };
        if lrh.vl == 15 {
            // VL15 carries SMPs to QP0 only.
            let parsed = match packet::parse(&pkt.bytes) {
                Ok(p) if p.hdr.bth.dest_qp == 0 && p.hdr.deth.is_some() => p,
                _ => {
                    self.ingress(in_port).rcv_errors += 1;
                    return Action::Drop("VL15 packet that is not an SMP");
                }
            };
            return self.receive_smp(in_port, &pkt.bytes, &parsed);
        }
        if lrh.dlid == PERMISSIVE_LID {
            // The permissive LID is for SMPs on VL15 only.
            self.ingress(in_port).rcv_errors += 1;
            return Action::Drop("permissive DLID off VL15");
        }
        let st = self.ports[usize::from(in_port)].state;
        if !matches!(st, LogicalState::Armed | LogicalState::Active) {
            return Action::Drop("data packet on a port that is not Armed or Active");
        }
        if self.is_own_lid(lrh.dlid) {
            let Ok(parsed) = packet::parse(&pkt.bytes) else {
                self.ingress(in_port).rcv_errors += 1;
                return Action::Drop("malformed packet for the switch");
            };
            if !self.end_port_check(in_port, &pkt.bytes) {
                return Action::Drop(BAD_ICRC);
            }
            return self.receive_gmp(in_port, &pkt.bytes, &parsed);
        }
        if (MLID_BASE..PERMISSIVE_LID).contains(&lrh.dlid) {
            return self.multicast(in_port, lrh.dlid, pkt);
        }
        match self.route(lrh.dlid) {
            Some(0) | None => {
                self.ingress(in_port).rcv_switch_relay_errors += 1;
                Action::Drop("unknown DLID")
            }
            Some(e) if e == in_port => {
                self.ingress(in_port).rcv_switch_relay_errors += 1;
                Action::Drop("LFT points back to the ingress port")
            }
            Some(e) => {
                if self.ports[usize::from(e)].state != LogicalState::Active {
                    self.count_xmit_discard(e);
                    return Action::Drop("egress port not Active");
                }
                if let Err(why) = self.partition_in(in_port, &pkt.bytes) {
                    return Action::Drop(why);
                }
                if let Err(why) = self.partition_out(e, &pkt.bytes) {
                    return Action::Drop(why);
                }
                Action::Send(e, pkt)
            }
        }
    }

    /// A packet for a multicast LID: a copy out of every port of the
    /// MLID's port mask that is Active, except the one it came in on. An
    /// MLID without an entry (or above MulticastFDBTop) is dropped and
    /// counted as a unicast DLID without a route is (PortRcvSwitchRelayErrors).
    fn multicast(&mut self, in_port: u8, mlid: u16, pkt: Packet) -> Action {
        let above_top = self.mft_top != 0 && mlid > self.mft_top;
        let ports: Vec<u8> = if above_top {
            Vec::new()
        } else {
            self.mft_ports(mlid)
                .into_iter()
                .filter(|&p| p != 0 && p != in_port)
                .collect()
        };
        if ports.is_empty() {
            self.ingress(in_port).rcv_switch_relay_errors += 1;
            // As a unicast DLID without an LFT entry.
            return Action::Drop("unknown DLID");
        }
        if let Err(why) = self.partition_in(in_port, &pkt.bytes) {
            return Action::Drop(why);
        }
        let mut out = Vec::with_capacity(ports.len());
        for e in ports {
            if self.ports[usize::from(e)].state != LogicalState::Active {
                self.count_xmit_discard(e);
                continue;
            }
            if self.partition_out(e, &pkt.bytes).is_err() {
                continue;
            }
            out.push((e, pkt.clone()));
        }
        if out.is_empty() {
            return Action::Drop("no Active egress port in the MLID's port mask");
        }
        Action::Replicate(out)
    }

    /// Partition enforcement and raw filtering at ingress port `p`, if the
    /// SM turned them on (PortInfo PartitionEnforcementInbound,
    /// FilterRawInbound): the packet's P_Key must be in the port's table
    /// (its 15-bit base: a switch does not check membership types).
    /// A refusal counts PortRcvConstraintErrors.
    fn partition_in(&mut self, p: u8, bytes: &[u8]) -> Result<(), &'static str> {
        let r = self.partition_check(p, bytes, ENFORCE_IN, FILTER_RAW_IN);
        if r.is_err() {
            self.ingress(p).rcv_constraint_errors += 1;
        }
        r
    }

    /// The same at egress port `p` (PartitionEnforcementOutbound,
    /// FilterRawOutbound; PortXmitConstraintErrors).
    fn partition_out(&mut self, p: u8, bytes: &[u8]) -> Result<(), &'static str> {
        let r = self.partition_check(p, bytes, ENFORCE_OUT, FILTER_RAW_OUT);
        if r.is_err()
            && let Some(sp) = self.ports.get_mut(usize::from(p))
        {
            sp.counters.xmit_constraint_errors += 1;
        }
        r
    }

    fn partition_check(
        &self,
        p: u8,
        bytes: &[u8],
        enforce: u8,
        filter_raw: u8,
    ) -> Result<(), &'static str> {
        let Some(sp) = self.ports.get(usize::from(p)) else {
            return Ok(());
        };
        if sp.enforce & (enforce | filter_raw) == 0 {
            return Ok(());
        }
        // LRH LNH: 0 and 1 raw, 2 BTH next, 3 GRH then BTH.
        let bth = match bytes.get(1).map(|b| b & 3) {
            Some(2) => 8,
            Some(3) => 8 + 40,
            _ if sp.enforce & filter_raw != 0 => return Err("raw packet filtered"),
            _ => return Ok(()),
        };
        if sp.enforce & enforce == 0 {
            return Ok(());
        }
        let Some(pk) = bytes.get(bth + 2..bth + 4) else {
            return Err("no BTH to read the P_Key from");
        };
        let pk = u16::from_be_bytes([pk[0], pk[1]]) & 0x7fff;
        if pk != 0 && sp.pkeys.iter().any(|&k| k & 0x7fff == pk) {
            Ok(())
        } else {
            Err("P_Key not in the switch port's partition table")
        }
    }

    /// The ICRC of a packet port 0 takes (the SMA's SMPs, every
    /// directed-route one included since the SMI rewrites it at each hop,
    /// and the PMA's GMPs): port 0 is that packet's end port, which checks
    /// the end-to-end CRC a forwarding switch leaves alone. A bad one
    /// counts PortRcvErrors on the ingress port.
    fn end_port_check(&mut self, in_port: u8, bytes: &[u8]) -> bool {
        let ok = packet::check_crcs(bytes).is_ok();
        if !ok {
            self.ingress(in_port).rcv_errors += 1;
        }
        ok
    }

    fn receive_smp(&mut self, in_port: u8, bytes: &[u8], p: &packet::Parsed) -> Action {
        let mad = p.payload(bytes);
        let dlid = p.hdr.lrh.dlid;
        // For this switch's SMA: the permissive LID (a directed route, at
        // every hop) or its own LID (LID routed, or the LID-routed start
        // of a directed route); anything else is LID-routed through. Its
        // CRCs before anything reads the MAD.
        let for_sma = dlid == PERMISSIVE_LID || self.is_own_lid(dlid);
        if for_sma && !self.end_port_check(in_port, bytes) {
            return Action::Drop(BAD_ICRC);
        }
        let smp = match Smp::parse(mad) {
            Ok(s) if s.hdr.base_version == 1 && s.hdr.class_version == 1 => s,
            _ => {
                self.ingress(in_port).vl15_dropped += 1;
                return Action::Drop("not an SMP this SMA takes");
            }
        };
        if smp.is_dr() && for_sma {
            return self.receive_dr(in_port, p, smp);
        }
        // LID routed.
        if for_sma {
            if smp.hdr.method & 0x80 != 0 {
                self.ingress(in_port).vl15_dropped += 1;
                return Action::Drop("a response for the switch's SM (there is none)");
            }
            let Some(resp) = self.sma(in_port, smp) else {
                self.ingress(in_port).vl15_dropped += 1;
                return Action::Drop("SMP refused by the SMA (M_Key)");
            };
            let dest = p.hdr.lrh.slid;
            let out = if dlid == PERMISSIVE_LID {
                Some(in_port)
            } else {
                self.route(dest).filter(|&e| e != 0)
            };
            let Some(e) = out else {
                self.ingress(in_port).rcv_switch_relay_errors += 1;
                return Action::Drop("no route back to the requester");
            };
            let mut h = packet::mad_headers(dest, self.lid, 0, 0, p.hdr.bth.pkey);
            h.lrh.sl = p.hdr.lrh.sl;
            return self.emit(e, &h, &resp.to_bytes());
        }
        match self.route(dlid) {
            Some(e) if e != 0 && e != in_port => {
                if !self.link_up(e) {
                    self.count_xmit_discard(e);
                    return Action::Drop("egress link down");
                }
                Action::Send(
                    e,
                    Packet {
                        bytes: bytes.to_vec(),
                    },
                )
            }
            _ => {
                self.ingress(in_port).rcv_switch_relay_errors += 1;
                Action::Drop("unknown DLID")
            }
        }
    }

    /// Directed-route SMP processing (IBTA 14.2.2.2 C14-9, 14.2.2.4
    /// C14-13) at this switch.
    fn receive_dr(&mut self, in_port: u8, p: &packet::Parsed, mut smp: Smp) -> Action {
        let drop = |sw: &mut Switch, why| {
            sw.ingress(in_port).vl15_dropped += 1;
            Action::Drop(why)
        };
        let cnt = smp.hop_cnt;
        if cnt >= 64 {
            return drop(self, "hop count above 63");
        }
        let ptr = smp.hop_ptr;
        let n = self.nports();
        // Reached by LID routing (the first, LID-routed part of a directed
        // route whose DrSLID is the requester's LID).
        let lid_routed_start = self.is_own_lid(p.hdr.lrh.dlid) && smp.dr_slid != PERMISSIVE_LID;
        if !smp.direction {
            if cnt != 0 && ptr == 0 && lid_routed_start {
                // C14-9:1 here: the directed part starts at this switch.
                smp.hop_ptr = 1;
                let e = smp.initial_path[1];
                if e == 0 || e > n {
                    return drop(self, "initial path names no port");
                }
                return self.forward_smp(e, p, &smp);
            }
            if cnt != 0 && ptr == 0 {
                return drop(self, "outgoing SMP with hop pointer 0 (C14-9:1)");
            }
            if ptr != 0 && ptr < cnt {
                // C14-9:2: an intermediate hop.
                smp.return_path[usize::from(ptr)] = in_port;
                smp.hop_ptr = ptr + 1;
                let e = smp.initial_path[usize::from(ptr) + 1];
                if e == 0 || e > n {
                    return drop(self, "initial path names no port");
                }
                return self.forward_smp(e, p, &smp);
            }
            if ptr == cnt {
                // C14-9:3: the end of the directed part.
                if cnt != 0 {
                    smp.return_path[usize::from(ptr)] = in_port;
                }
                smp.hop_ptr = ptr + 1;
                if smp.dr_dlid != PERMISSIVE_LID {
                    return drop(self, "LID-routed end of a DR SMP (not modelled)");
                }
                return self.answer_dr(in_port, p, smp);
            }
            if u16::from(ptr) == u16::from(cnt) + 1 {
                // C14-9:4: delivered here by LID routing.
                return self.answer_dr(in_port, p, smp);
            }
            return drop(self, "unreasonable hop pointer (C14-9:5)");
        }
        // Returning (D = 1).
        if (2..=cnt).contains(&ptr) {
            // C14-13:2: an intermediate hop.
            smp.hop_ptr = ptr - 1;
            let e = smp.return_path[usize::from(ptr) - 1];
            if e == 0 || e > n {
                return drop(self, "return path names no port");
            }
            return self.forward_smp(e, p, &smp);
        }
        if ptr == 1 && smp.dr_slid != PERMISSIVE_LID {
            // C14-13:3: the end of the directed part; LID routed from here
            // to the requester.
            smp.hop_ptr = 0;
            return self.lid_route_smp(in_port, p, &smp);
        }
        drop(self, "returning SMP ends at a switch (no SM here)")
    }

    /// Sends a directed-route SMP by LID routing to its DrSLID (the
    /// LID-routed last part of a response), from this switch's LID.
    fn lid_route_smp(&mut self, in_port: u8, p: &packet::Parsed, smp: &Smp) -> Action {
        let Some(e) = self.route(smp.dr_slid).filter(|&e| e != 0) else {
            self.ingress(in_port).rcv_switch_relay_errors += 1;
            return Action::Drop("no route to the DrSLID");
        };
        if !self.link_up(e) {
            self.count_xmit_discard(e);
            return Action::Drop("egress link down");
        }
        let mut h = packet::mad_headers(smp.dr_slid, self.lid, 0, 0, p.hdr.bth.pkey);
        h.lrh.sl = p.hdr.lrh.sl;
        self.emit(e, &h, &smp.to_bytes())
    }

    /// Answers a DR SMP that reached this switch and sends the response
    /// back along the return path (C14-13:1).
    fn answer_dr(&mut self, in_port: u8, p: &packet::Parsed, smp: Smp) -> Action {
        if smp.hdr.method & 0x80 != 0 {
            self.ingress(in_port).vl15_dropped += 1;
            return Action::Drop("a response for the switch's SM (there is none)");
        }
        let Some(mut resp) = self.sma(in_port, smp) else {
            self.ingress(in_port).vl15_dropped += 1;
            return Action::Drop("SMP refused by the SMA (M_Key)");
        };
        resp.direction = true;
        let cnt = resp.hop_cnt;
        if cnt == 0 && resp.dr_slid != PERMISSIVE_LID && self.is_own_lid(p.hdr.lrh.dlid) {
            // Reached by LID routing alone: back the same way.
            resp.hop_ptr = 0;
            return self.lid_route_smp(in_port, p, &resp);
        }
        if cnt == 0 {
            // A zero-hop SMP addressed to the switch by its neighbour.
            let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, p.hdr.bth.pkey);
            return self.emit(in_port, &h, &resp.to_bytes());
        }
        resp.hop_ptr = cnt;
        let e = resp.return_path[usize::from(cnt)];
        if e == 0 || e > self.nports() {
            self.ingress(in_port).vl15_dropped += 1;
            return Action::Drop("return path names no port");
        }
        let mut h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, p.hdr.bth.pkey);
        h.lrh.sl = p.hdr.lrh.sl;
        self.emit(e, &h, &resp.to_bytes())
    }

    fn forward_smp(&mut self, e: u8, p: &packet::Parsed, smp: &Smp) -> Action {
        if !self.link_up(e) {
            self.count_xmit_discard(e);
            return Action::Drop("egress link down");
        }
        // The directed part travels with permissive LIDs (a directed route
        // that began by LID routing arrived with this switch's LID).
        let lrh = Lrh {
            dlid: PERMISSIVE_LID,
            slid: PERMISSIVE_LID,
            ..p.hdr.lrh
        };
        let h = Headers {
            lrh,
            bth: p.hdr.bth,
            deth: p.hdr.deth,
            grh: p.hdr.grh,
            ..Headers::default()
        };
        self.emit(e, &h, &smp.to_bytes())
    }

    fn emit(&mut self, e: u8, h: &Headers, payload: &[u8]) -> Action {
        match packet::build(h, payload) {
            Ok(bytes) => Action::Send(e, Packet { bytes }),
            Err(_) => Action::Drop("response does not build"),
        }
    }

    /// The SMA: answers one SMP (Get/Set); `None` when the M_Key check
    /// says to drop it silently.
    fn sma(&mut self, in_port: u8, smp: Smp) -> Option<Smp> {
        let meth = smp.hdr.method;
        let key_ok = self.mkey == 0 || smp.mkey == self.mkey;
        if self.mkey != 0 && key_ok {
            // The key stops a running lease timer.
            self.mkey_lease_due = None;
        }
        if !key_ok && (meth == method::SET || self.mkey_protect >= 2) {
            self.mkey_violations = self.mkey_violations.saturating_add(1);
            if self.mkey_lease != 0 && self.mkey_lease_due.is_none() {
                let lease_ns = u64::from(self.mkey_lease) * 1_000_000_000;
                self.mkey_lease_due = Some(self.now_ns.saturating_add(lease_ns));
            }
            return None;
        }
        let mut r = smp.clone();
        r.hdr.method = method::GET_RESP;
        let status = if meth == method::GET || meth == method::SET {
            self.attribute(in_port, meth == method::SET, &smp, &mut r.data)
        } else {
            mad_status::METHOD_UNSUPPORTED
        };
        r.hdr.status = status;
        Some(r)
    }

    fn attribute(&mut self, in_port: u8, set: bool, smp: &Smp, out: &mut [u8; 64]) -> u16 {
        let m = smp.hdr.attr_mod;
        let d = &smp.data;
        match (smp.hdr.attr_id, set) {
            (attr::NODE_DESC, false) => {
                out.fill(0);
                for (o, c) in out.iter_mut().zip(self.description.bytes()) {
                    *o = c;
                }
            }
            (attr::NODE_INFO, false) => {
                out.fill(0);
                out[0] = 1; // BaseVersion
                out[1] = 1; // ClassVersion
                out[2] = 2; // NodeType: switch
                out[3] = self.nports();
                out[4..12].copy_from_slice(&self.sys_image_guid.to_be_bytes());
                out[12..20].copy_from_slice(&self.node_guid.to_be_bytes());
                out[20..28].copy_from_slice(&self.node_guid.to_be_bytes());
                out[28..30].copy_from_slice(&(PKEY_CAP as u16).to_be_bytes());
                out[30..32].copy_from_slice(&self.device_id.to_be_bytes());
                out[32..36].copy_from_slice(&self.revision.to_be_bytes());
                let w = u32::from(in_port) << 24 | (self.vendor_id & 0xff_ffff);
                out[36..40].copy_from_slice(&w.to_be_bytes());
            }
            (attr::SWITCH_INFO, _) => {
                if set {
                    self.lft_top = u16::from_be_bytes([d[6], d[7]]).min((LFT_CAP - 1) as u16);
                    if d[11] & 0x04 != 0 {
                        self.port_state_change = false;
                    }
                    self.life_time = d[11] >> 3;
                    self.mft_top = u16::from_be_bytes([d[18], d[19]]);
                }
                self.encode_switch_info(out);
            }
            (attr::PORT_INFO, _) => {
                let port = (m & 0xff) as u8;
                if port > self.nports() {
                    return mad_status::INVALID_FIELD;
                }
                // IBTA 14.2.4.1, protection level 1: a Get without the
                // key is answered with the M_Key field 0 (level 2 and up
                // do not answer it at all: `sma`).
                let show_mkey = self.mkey == 0 || smp.mkey == self.mkey || self.mkey_protect != 1;
                // Bit 31: the SM's SMSupportsExtendedSpeeds (OpenSM sets
                // it for a port whose CapabilityMask, port 0's for a
                // switch, has IsExtendedSpeedsSupported).
                let ext = m & 0x8000_0000 != 0;
                if set && let Err(s) = self.port_info_set(port, d, ext) {
                    self.encode_port_info(port, in_port, show_mkey, out);
                    return s;
                }
                self.encode_port_info(port, in_port, show_mkey, out);
            }
            (attr::PKEY_TABLE, _) => {
                // Port 0's table (NodeInfo PartitionCap) or an external
                // port's partition enforcement table (SwitchInfo
                // PartitionEnforcementCap), 32 entries a block.
                let port = (m >> 16) as u8;
                let block = (m & 0xffff) as usize;
                let t: &mut [u16] = if port == 0 {
                    &mut self.pkeys
                } else if port <= self.nports() {
                    &mut self.ports[usize::from(port)].pkeys
                } else {
                    return mad_status::INVALID_FIELD;
                };
                let Some(t) = t.get_mut(block * 32..block * 32 + 32) else {
                    return mad_status::INVALID_FIELD;
                };
                if set {
                    for (k, e) in t.iter_mut().enumerate() {
                        *e = u16::from_be_bytes([d[2 * k], d[2 * k + 1]]);
                    }
                }
                for (k, e) in t.iter().enumerate() {
                    out[2 * k..2 * k + 2].copy_from_slice(&e.to_be_bytes());
                }
            }
            (attr::GUID_INFO, _) => {
                // GUIDCap 1: block 0, entry 0 is port 0's GUID, the node
                // GUID (read-only; ibsim answers the same).
                if m != 0 {
                    return mad_status::INVALID_FIELD;
                }
                out.fill(0);
                out[0..8].copy_from_slice(&self.node_guid.to_be_bytes());
            }
            (attr::MULTICAST_FORWARDING_TABLE, _) => {
                // Modifier: PortMask position (bits 31:28, 16 ports
                // each) and the block of 32 MLIDs (bits 8:0).
                let pos = (m >> 28) as usize;
                let block = (m & 0x1ff) as usize;
                if pos >= self.mft_positions || block >= MCAST_CAP / 32 {
                    return mad_status::INVALID_FIELD;
                }
                for k in 0..32 {
                    let e = &mut self.mft[(block * 32 + k) * self.mft_positions + pos];
                    if set {
                        *e = u16::from_be_bytes([d[2 * k], d[2 * k + 1]]);
                    }
                    out[2 * k..2 * k + 2].copy_from_slice(&e.to_be_bytes());
                }
            }
            (attr::MLNX_EXT_PORT_INFO, _) => {
                // Mellanox ExtendedPortInfo of port `m`: StateChangeEnable
                // (byte 3), LinkSpeedSupported/Enabled/Active (bytes 7,
                // 11, 15; bit 0 is FDR10). The model's links do not run
                // FDR10, so none is supported, enabled or active (as
                // ibsim answers by default): FDR comes through PortInfo's
                // extended speeds. A Set keeps what it may.
                let port = (m & 0xff) as u8;
                if port > self.nports() || m >> 8 != 0 {
                    return mad_status::INVALID_FIELD;
                }
                let sp = &mut self.ports[usize::from(port)];
                if set {
                    sp.mlnx_state_change_enable = d[3] & 1;
                    sp.mlnx_speed_enabled = d[11] & MLNX_SPEEDS_SUPPORTED;
                }
                *out = mlnx_ext_port_info(sp.mlnx_state_change_enable, sp.mlnx_speed_enabled);
            }
            (attr::SL_TO_VL_TABLE, _) => {
                // Kept and reported; forwarding does not remap VLs.
                let (inp, outp) = (((m >> 8) & 0xff) as u8, (m & 0xff) as u8);
                if inp > self.nports() || outp > self.nports() || m >> 16 != 0 {
                    return mad_status::INVALID_FIELD;
                }
                let e = self.sl2vl.entry((inp, outp)).or_insert([0; 8]);
                if set {
                    e.copy_from_slice(&d[..8]);
                }
                out.fill(0);
                out[..8].copy_from_slice(e);
            }
            (attr::VL_ARB_TABLE, _) => {
                // Kept and reported; there is no arbitration to apply.
                let (block, port) = ((m >> 16) as u8, (m & 0xff) as u8);
                if !(1..=4).contains(&block) || port > self.nports() {
                    return mad_status::INVALID_FIELD;
                }
                let e = self.vlarb.entry((port, block)).or_insert([0; 64]);
                if set {
                    e.copy_from_slice(d);
                }
                out.copy_from_slice(e);
            }
            (attr::LINEAR_FORWARDING_TABLE, _) => {
                let block = m as usize;
                if block >= LFT_CAP / 64 {
                    return mad_status::INVALID_FIELD;
                }
                let t = &mut self.lft[block * 64..block * 64 + 64];
                if set {
                    t.copy_from_slice(d);
                }
                out.copy_from_slice(t);
            }
            _ => return mad_status::ATTR_UNSUPPORTED,
        }
        0
    }

    fn encode_switch_info(&self, out: &mut [u8; 64]) {
        out.fill(0);
        out[0..2].copy_from_slice(&(LFT_CAP as u16).to_be_bytes()); // LinearFDBCap
        out[2..4].copy_from_slice(&0u16.to_be_bytes()); // RandomFDBCap
        out[4..6].copy_from_slice(&(MCAST_CAP as u16).to_be_bytes()); // MulticastFDBCap
        out[6..8].copy_from_slice(&self.lft_top.to_be_bytes());
        out[8] = 0; // DefaultPort
        out[9] = 0; // DefaultMulticastPrimaryPort
        out[10] = 0; // DefaultMulticastNotPrimaryPort
        out[11] = (self.life_time & 0x1f) << 3 | u8::from(self.port_state_change) << 2;
        out[12..14].copy_from_slice(&0u16.to_be_bytes()); // LIDsPerPort
        out[14..16].copy_from_slice(&(PART_ENFORCE_CAP as u16).to_be_bytes());
        // Inbound and outbound enforcement, raw filtering both ways; base
        // port 0 (not enhanced).
        out[16] = 0xf0;
        out[18..20].copy_from_slice(&self.mft_top.to_be_bytes()); // MulticastFDBTop
    }

    fn encode_port_info(&self, port: u8, in_port: u8, show_mkey: bool, out: &mut [u8; 64]) {
        out.fill(0);
        let sp = &self.ports[usize::from(port)];
        if show_mkey {
            out[0..8].copy_from_slice(&self.mkey.to_be_bytes());
        }
        out[8..16].copy_from_slice(&self.gid_prefix.to_be_bytes());
        out[16..18].copy_from_slice(&self.lid.to_be_bytes());
        out[18..20].copy_from_slice(&self.sm_lid.to_be_bytes());
        if port == 0 {
            out[20..24].copy_from_slice(&PORT0_CAP_MASK.to_be_bytes());
        }
        out[26..28].copy_from_slice(&self.mkey_lease.to_be_bytes());
        out[28] = in_port; // LocalPortNum: where the SMP came in
        out[29] = 0x03; // LinkWidthEnabled 1x, 4x
        out[30] = 0x03; // LinkWidthSupported
        out[31] = 0x02; // LinkWidthActive 4x
        out[32] = 0x70 | sp.state as u8; // speeds SDR/DDR/QDR | PortState
        out[33] = (sp.phys as u8) << 4 | 2; // PhysState | LinkDownDefault Polling
        out[34] = self.mkey_protect << 6 | (self.lmc & 7);
        out[35] = 0x40 | 0x07; // active QDR | enabled SDR/DDR/QDR
        out[36] = sp.neighbor_mtu << 4 | (self.sm_sl & 0xf);
        out[37] = 4 << 4; // VLCap VL0-7
        out[39] = 8;
        out[40] = 8;
        out[41] = 5; // MTUCap 4096
        out[42] = 0x1f; // HOQLife
        out[43] = sp.op_vls << 4 | sp.enforce;
        out[44..46].copy_from_slice(&self.mkey_violations.to_be_bytes());
        out[50] = 1; // GUIDCap
        out[51] = self.subnet_timeout & 0x1f;
        out[52] = 0x10;
        if port != 0 {
            // LinkSpeedExtActive | LinkSpeedExtSupported; the reserved
            // bits and LinkSpeedExtEnabled.
            out[62] = self.link_speed_ext_active(port) << 4 | LINK_SPEEDS_EXT_SUPPORTED;
            out[63] = sp.speeds_ext_enabled & 0x1f;
        }
    }

    /// SubnSet(PortInfo) of port `port`: port 0 takes the subnet
    /// attributes (LID, LMC, SM LID/SL, M_Key, timeouts); every port takes
    /// PortState, PortPhysicalState (3 disables, 2 enables), NeighborMTU
    /// and OperationalVLs, an external port LinkSpeedExtEnabled when `ext`
    /// (the modifier's SMSupportsExtendedSpeeds: 0 no change, 30 none, 31
    /// all supported). An invalid state change leaves everything as it
    /// was and answers "invalid field".
    fn port_info_set(&mut self, port: u8, d: &[u8; 64], ext: bool) -> Result<(), u16> {
        let sp = &self.ports[usize::from(port)];
        let new_state = sp
            .state
            .set_by_sm(d[32] & 0xf)
            .ok_or(mad_status::INVALID_FIELD)?;
        let phys_req = d[33] >> 4;
        if !matches!(phys_req, 0 | 2 | 3) || (port == 0 && phys_req != 0) {
            return Err(mad_status::INVALID_FIELD);
        }
        if port == 0 {
            let lid = u16::from_be_bytes([d[16], d[17]]);
            if lid >= 0xc000 {
                return Err(mad_status::INVALID_FIELD);
            }
            self.mkey = u64::from_be_bytes(d[0..8].try_into().unwrap_or([0; 8]));
            self.gid_prefix = u64::from_be_bytes(d[8..16].try_into().unwrap_or([0; 8]));
            self.lid = lid;
            self.sm_lid = u16::from_be_bytes([d[18], d[19]]);
            self.mkey_lease = u16::from_be_bytes([d[26], d[27]]);
            self.mkey_protect = d[34] >> 6;
            self.lmc = d[34] & 7;
            self.sm_sl = d[36] & 0xf;
            self.subnet_timeout = d[51] & 0x1f;
        }
        let sp = &mut self.ports[usize::from(port)];
        let nmtu = d[36] >> 4;
        if (1..=5).contains(&nmtu) {
            sp.neighbor_mtu = nmtu;
        }
        let vls = d[43] >> 4;
        if (1..=4).contains(&vls) {
            sp.op_vls = vls;
        }
        if port != 0 {
            sp.enforce = d[43] & 0x0f;
        }
        if port != 0 && ext {
            sp.speeds_ext_enabled = match d[63] & 0x1f {
                0 => sp.speeds_ext_enabled,
                30 => 0,
                31 => LINK_SPEEDS_EXT_SUPPORTED,
                v => v & LINK_SPEEDS_EXT_SUPPORTED,
            };
        }
        match phys_req {
            3 if port != 0 && !sp.disabled => {
                // Down at once; the fabric takes the cable's link down
                // right after this SMP.
                sp.disabled = true;
                if sp.phys == PhysicalState::LinkUp {
                    sp.counters.link_downed += 1;
                }
                sp.phys = PhysicalState::Disabled;
                if sp.state != LogicalState::Down {
                    sp.state = LogicalState::Down;
                    self.port_state_change = true;
                }
                return Ok(());
            }
            2 if sp.disabled => {
                // Polling until the fabric brings the link up.
                sp.disabled = false;
                sp.phys = PhysicalState::Polling;
                return Ok(());
            }
            2 if port != 0 && sp.phys == PhysicalState::LinkUp => {
                // Polling on a live link: it retrains (the fabric takes it
                // down and up again right after this SMP).
                sp.retrain = true;
                return Ok(());
            }
            _ => {}
        }
        match new_state {
            Some(LogicalState::Down) if port != 0 => {
                // The link retrains: Down, then Init again while it is up.
                sp.state = if sp.phys == PhysicalState::LinkUp && !sp.disabled {
                    LogicalState::Init
                } else {
                    LogicalState::Down
                };
            }
            Some(LogicalState::Down) => sp.state = LogicalState::Init,
            Some(s) => sp.state = s,
            // Base port 0 has no link of its own: it is Active once the SM
            // gave the switch a LID (ibsim reports it Active too).
            None if port == 0 && self.lid != 0 && sp.state == LogicalState::Init => {
                sp.state = LogicalState::Active;
            }
            None => {}
        }
        Ok(())
    }

    /// A GMP addressed to the switch (its LID): the PMA answers, other
    /// classes are dropped.
    fn receive_gmp(&mut self, in_port: u8, bytes: &[u8], p: &packet::Parsed) -> Action {
        let Some(deth) = p.hdr.deth else {
            return Action::Drop("no DETH: not a datagram for the switch");
        };
        if p.hdr.bth.dest_qp != 1 || deth.qkey != GSI_QKEY {
            return Action::Drop("not a GMP for QP1 with the GSI Q_Key");
        }
        let pk = p.hdr.bth.pkey & 0x7fff;
        if !self.pkeys.iter().any(|&k| k != 0 && k & 0x7fff == pk) {
            return Action::Drop("P_Key not in the switch's table");
        }
        let mad = p.payload(bytes);
        let Ok(hdr) = MadHdr::parse(mad) else {
            return Action::Drop("short MAD");
        };
        if mad.len() < MAD_LEN
            || hdr.base_version != 1
            || hdr.mgmt_class != mgmt_class::PERF_MGMT
            || hdr.method & 0x80 != 0
        {
            return Action::Drop("not a PMA request");
        }
        let mut r = [0u8; MAD_LEN];
        r.copy_from_slice(&mad[..MAD_LEN]);
        let status = if hdr.class_version != 1 {
            mad_status::BAD_VERSION
        } else {
            self.pma(hdr, &mut r)
        };
        let mut rh = hdr;
        rh.method = method::GET_RESP;
        rh.status = status;
        rh.write(&mut r);
        let dest = p.hdr.lrh.slid;
        // The response goes where the LFT says, like every packet the
        // switch sends by LID.
        let e = match self.route(dest) {
            Some(e) if e != 0 => e,
            _ => {
                self.ingress(in_port).rcv_switch_relay_errors += 1;
                return Action::Drop("no route back to the requester");
            }
        };
        let h = Headers {
            lrh: Lrh {
                vl: p.hdr.lrh.vl,
                sl: p.hdr.lrh.sl,
                dlid: dest,
                slid: self.lid,
                ..Lrh::default()
            },
            bth: Bth {
                opcode: packet::opcode::UD_SEND_ONLY,
                pkey: p.hdr.bth.pkey,
                dest_qp: deth.src_qp,
                ..Bth::default()
            },
            deth: Some(Deth {
                qkey: GSI_QKEY,
                src_qp: 1,
            }),
            ..Headers::default()
        };
        if self.ports[usize::from(e)].state != LogicalState::Active {
            self.count_xmit_discard(e);
            return Action::Drop("egress port not Active");
        }
        self.emit(e, &h, &r)
    }

    fn pma(&mut self, hdr: MadHdr, r: &mut [u8; MAD_LEN]) -> u16 {
        const D: usize = packet::PMA_DATA;
        let set = match hdr.method {
            method::GET => false,
            method::SET => true,
            _ => return mad_status::METHOD_UNSUPPORTED,
        };
        match (hdr.attr_id, set) {
            (attr::CLASS_PORT_INFO, false) => {
                r[D..].fill(0);
                r[D] = 1; // BaseVersion
                r[D + 1] = 1; // ClassVersion
                // CapabilityMask: AllPortSelect (bit 8), extended counters
                // (bit 9).
                r[D + 2..D + 4].copy_from_slice(&0x0300u16.to_be_bytes());
                r[D + 4..D + 8].copy_from_slice(&0x12u32.to_be_bytes());
                0
            }
            (attr::PORT_COUNTERS | attr::PORT_COUNTERS_EXT, _) => {
                let sel_port = r[D + 1];
                let select = u16::from_be_bytes([r[D + 2], r[D + 3]]);
                let n = self.nports();
                let range = if sel_port == 0xff {
                    1..=n
                } else if sel_port <= n {
                    sel_port..=sel_port
                } else {
                    return mad_status::INVALID_FIELD;
                };
                let ext = hdr.attr_id == attr::PORT_COUNTERS_EXT;
                if set {
                    for p in range.clone() {
                        let c = &mut self.ports[usize::from(p)].counters;
                        if ext {
                            clear_ext(c, select);
                        } else {
                            clear(c, select);
                        }
                    }
                }
                let mut c = PortCounters::default();
                for p in range {
                    c.add(&self.ports[usize::from(p)].counters);
                }
                r[D..].fill(0);
                r[D + 1] = sel_port;
                r[D + 2..D + 4].copy_from_slice(&select.to_be_bytes());
                if ext {
                    encode_ext(&c, &mut r[D..]);
                } else {
                    encode(&c, &mut r[D..]);
                }
                0
            }
            _ => mad_status::ATTR_UNSUPPORTED,
        }
    }
}

/// Mellanox ExtendedPortInfo LinkSpeedSupported of every port (bit 0 is
/// FDR10; the model's links do not run it).
pub const MLNX_SPEEDS_SUPPORTED: u8 = 0;

/// Mellanox ExtendedPortInfo as on the wire (OpenSM's
/// `ib_mlnx_ext_port_info_t`, libibmad's `IB_MLNX_EXT_PORT_*` fields):
/// StateChangeEnable, LinkSpeedSupported, LinkSpeedEnabled and
/// LinkSpeedActive in the last byte of the first four 32-bit words.
pub fn mlnx_ext_port_info(state_change_enable: u8, speed_enabled: u8) -> [u8; 64] {
    let mut o = [0u8; 64];
    o[3] = state_change_enable;
    o[7] = MLNX_SPEEDS_SUPPORTED;
    o[11] = speed_enabled;
    o[15] = 0; // LinkSpeedActive: not FDR10
    o
}

/// The link-level checks of a received packet: LRH LVer 0, PktLen equal
/// to the bytes present, VCRC.
fn link_check(b: &[u8], vcrc: bool) -> Result<Lrh, packet::PacketError> {
    let lrh = Lrh::parse(b)?;
    if lrh.lver != 0 {
        return Err(packet::PacketError::BadLver(lrh.lver));
    }
    let body = b.len().saturating_sub(packet::VCRC_LEN);
    if usize::from(lrh.pkt_len) * 4 != body || b.len() > packet::MAX_PACKET {
        return Err(packet::PacketError::BadPktLen {
            words: lrh.pkt_len,
            bytes: body,
        });
    }
    if vcrc {
        packet::check_vcrc(b)?;
    }
    Ok(lrh)
}

fn words(len: usize) -> u64 {
    (len.saturating_sub(packet::VCRC_LEN) / 4) as u64
}

fn sat(v: u64, max: u64) -> u64 {
    v.min(max)
}

/// PortCounters (IBTA 16.1.3.5) data, 32-bit data counters and narrower
/// error counters saturating.
pub(crate) fn encode(c: &PortCounters, d: &mut [u8]) {
    d[4..6].copy_from_slice(&(sat(c.symbol_errors, 0xffff) as u16).to_be_bytes());
    d[7] = sat(c.link_downed, 0xff) as u8;
    d[8..10].copy_from_slice(&(sat(c.rcv_errors, 0xffff) as u16).to_be_bytes());
    d[12..14].copy_from_slice(&(sat(c.rcv_switch_relay_errors, 0xffff) as u16).to_be_bytes());
    d[14..16].copy_from_slice(&(sat(c.xmit_discards, 0xffff) as u16).to_be_bytes());
    d[16] = sat(c.xmit_constraint_errors, 0xff) as u8;
    d[17] = sat(c.rcv_constraint_errors, 0xff) as u8;
    d[22..24].copy_from_slice(&(sat(c.vl15_dropped, 0xffff) as u16).to_be_bytes());
    d[24..28].copy_from_slice(&(sat(c.xmit_data, 0xffff_ffff) as u32).to_be_bytes());
    d[28..32].copy_from_slice(&(sat(c.rcv_data, 0xffff_ffff) as u32).to_be_bytes());
    d[32..36].copy_from_slice(&(sat(c.xmit_pkts, 0xffff_ffff) as u32).to_be_bytes());
    d[36..40].copy_from_slice(&(sat(c.rcv_pkts, 0xffff_ffff) as u32).to_be_bytes());
}

/// PortCountersExtended (IBTA 16.1.4.11): 64-bit data and packet counters.
pub(crate) fn encode_ext(c: &PortCounters, d: &mut [u8]) {
    d[8..16].copy_from_slice(&c.xmit_data.to_be_bytes());
    d[16..24].copy_from_slice(&c.rcv_data.to_be_bytes());
    d[24..32].copy_from_slice(&c.xmit_pkts.to_be_bytes());
    d[32..40].copy_from_slice(&c.rcv_pkts.to_be_bytes());
    // Everything here is unicast.
    d[40..48].copy_from_slice(&c.xmit_pkts.to_be_bytes());
    d[48..56].copy_from_slice(&c.rcv_pkts.to_be_bytes());
}

/// PortCounters CounterSelect bits (IBTA table 247).
pub(crate) fn clear(c: &mut PortCounters, sel: u16) {
    let bits: [(u16, &mut u64); 11] = [
        (0x0001, &mut c.symbol_errors),
        (0x0004, &mut c.link_downed),
        (0x0008, &mut c.rcv_errors),
        (0x0020, &mut c.rcv_switch_relay_errors),
        (0x0040, &mut c.xmit_discards),
        (0x0080, &mut c.xmit_constraint_errors),
        (0x0100, &mut c.rcv_constraint_errors),
        (0x0800, &mut c.vl15_dropped),
        (0x1000, &mut c.xmit_data),
        (0x2000, &mut c.rcv_data),
        (0x4000, &mut c.xmit_pkts),
    ];
    for (b, v) in bits {
        if sel & b != 0 {
            *v = 0;
        }
    }
    if sel & 0x8000 != 0 {
        c.rcv_pkts = 0;
    }
}

/// PortCountersExtended CounterSelect bits.
pub(crate) fn clear_ext(c: &mut PortCounters, sel: u16) {
    if sel & 0x01 != 0 {
        c.xmit_data = 0;
    }
    if sel & 0x02 != 0 {
        c.rcv_data = 0;
    }
    if sel & 0x04 != 0 {
        c.xmit_pkts = 0;
    }
    if sel & 0x08 != 0 {
        c.rcv_pkts = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_info_and_node_info_golden() {
        let mut sw = Switch::new("sw", 0x0002_c900_0000_0100, 36);
        let mut out = [0u8; 64];
        let smp = Smp::dr_get(1, attr::NODE_INFO, 0, &[1]).unwrap();
        assert_eq!(sw.attribute(7, false, &smp, &mut out), 0);
        assert_eq!(&out[0..4], &[1, 1, 2, 36]);
        assert_eq!(&out[12..20], &0x0002_c900_0000_0100u64.to_be_bytes());
        assert_eq!(&out[30..32], &[0xc7, 0x38], "device id");
        assert_eq!(&out[36..40], &[7, 0x00, 0x02, 0xc9], "local port, vendor");
        sw.lft_top = 0x20;
        sw.port_state_change = true;
        sw.encode_switch_info(&mut out);
        assert_eq!(&out[0..2], &[0xc0, 0x00], "LinearFDBCap");
        assert_eq!(&out[6..8], &[0x00, 0x20], "LinearFDBTop");
        assert_eq!(out[11] & 0x04, 0x04, "PortStateChange");
    }

    /// IBTA 14.2.4.2 at the switch: an SMP without the key at protection
    /// level 2 is dropped and starts the lease timer; an SMP with the key
    /// stops it; once it runs out the protection bits are 0 and a Get
    /// without the key reads the key (what lets a new SM take over).
    #[test]
    fn the_mkey_lease_runs_out_and_the_protection_falls_to_zero() {
        const KEY: u64 = 0xdead_beef;
        const S: u64 = 1_000_000_000;
        let mut sw = Switch::new("sw", 0x0002_c900_0000_0100, 8);
        let mut set = Smp::lid_routed(1, method::SET, attr::PORT_INFO, 0);
        set.data[0..8].copy_from_slice(&KEY.to_be_bytes());
        set.data[16..18].copy_from_slice(&2u16.to_be_bytes()); // LID
        set.data[26..28].copy_from_slice(&2u16.to_be_bytes()); // lease 2 s
        set.data[34] = 2 << 6; // protection level 2
        let r = sw.sma(1, set).expect("the first Set (no key yet)");
        assert_eq!(r.hdr.status, 0);
        assert_eq!(sw.mkey_protect(), 2);
        let get = |key: u64| {
            let mut g = Smp::lid_routed(2, method::GET, attr::PORT_INFO, 0);
            g.mkey = key;
            g
        };
        // Without the key: dropped, counted, the timer starts (at 1 s).
        sw.set_time(S);
        assert!(sw.sma(1, get(0)).is_none());
        assert_eq!(sw.mkey_violations, 1);
        sw.set_time(2 * S);
        assert!(sw.sma(1, get(0)).is_none(), "the timer runs until 3 s");
        // The key stops it: nothing runs out at 3 s.
        assert!(sw.sma(1, get(KEY)).is_some());
        sw.set_time(4 * S);
        assert_eq!(sw.mkey_protect(), 2, "stopped by the key");
        // Started again at 4 s, out at 6 s.
        assert!(sw.sma(1, get(0)).is_none());
        sw.set_time(6 * S - 1);
        assert!(sw.sma(1, get(0)).is_none());
        assert_eq!(sw.mkey_protect(), 2);
        sw.set_time(6 * S);
        assert_eq!(sw.mkey_protect(), 0, "the lease ran out");
        let r = sw
            .sma(1, get(0))
            .expect("a Get without the key is answered");
        assert_eq!(&r.data[0..8], &KEY.to_be_bytes(), "and shows the key");
        assert_eq!(r.data[34] >> 6, 0);
        assert_eq!(&r.data[26..28], &[0, 2], "the lease period stays");
        // A lease period of 0 never runs out.
        let mut set = Smp::lid_routed(3, method::SET, attr::PORT_INFO, 0);
        set.mkey = KEY;
        set.data[0..8].copy_from_slice(&KEY.to_be_bytes());
        set.data[16..18].copy_from_slice(&2u16.to_be_bytes());
        set.data[34] = 2 << 6;
        assert!(sw.sma(1, set).is_some());
        assert!(sw.sma(1, get(0)).is_none());
        sw.set_time(1000 * S);
        assert_eq!(sw.mkey_protect(), 2);
    }

    #[test]
    fn counter_select_bits() {
        let mut c = PortCounters {
            xmit_discards: 5,
            xmit_pkts: 9,
            rcv_pkts: 3,
            ..PortCounters::default()
        };
        clear(&mut c, 0x0040);
        assert_eq!((c.xmit_discards, c.xmit_pkts, c.rcv_pkts), (0, 9, 3));
        clear(&mut c, 0x8000);
        assert_eq!(c.rcv_pkts, 0);
        let mut d = [0u8; 64];
        c.xmit_data = 1 << 40;
        encode(&c, &mut d);
        assert_eq!(&d[24..28], &[0xff; 4], "32-bit PortXmitData saturates");
        encode_ext(&c, &mut d);
        assert_eq!(&d[8..16], &(1u64 << 40).to_be_bytes());
    }
}
