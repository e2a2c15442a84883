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

mod pma;
mod sma;

pub(crate) use pma::{clear, clear_ext, encode, encode_ext};

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
    /// MTUCap (PortInfo encoding; 4096 unless a test narrows the port with
    /// [`Switch::set_mtu_cap`]): NeighborMTU is never set above it.
    pub mtu_cap: u8,
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
            mtu_cap: 5,
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

    /// Narrows external port `p`'s MTUCap to `mtu` (PortInfo encoding, 1 =
    /// 256 bytes .. 5 = 4096), as a switch that carries no larger packets:
    /// an SM then sets both ends of its cable to at most that NeighborMTU.
    /// False for port 0, a port that does not exist or an invalid MTU.
    pub fn set_mtu_cap(&mut self, p: u8, mtu: u8) -> bool {
        if p == 0 || !(1..=5).contains(&mtu) {
            return false;
        }
        let Some(sp) = self.ports.get_mut(usize::from(p)) else {
            return false;
        };
        sp.mtu_cap = mtu;
        sp.neighbor_mtu = sp.neighbor_mtu.min(mtu);
        true
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

    /// A port narrowed to MTU 2048 says so in its MTUCap, and an SM's
    /// NeighborMTU above it is held to it; the other ports stay at 4096.
    #[test]
    fn a_narrowed_port_reports_its_mtu_cap_and_holds_neighbor_mtu_to_it() {
        let mut sw = Switch::new("sw", 0x0002_c900_0000_0100, 8);
        assert!(sw.set_mtu_cap(3, 4));
        assert!(!sw.set_mtu_cap(0, 4) && !sw.set_mtu_cap(9, 4) && !sw.set_mtu_cap(3, 6));
        let get = |port: u32| Smp::lid_routed(1, method::GET, attr::PORT_INFO, port);
        let r = sw.sma(1, get(3)).expect("PortInfo of port 3");
        assert_eq!((r.data[41], r.data[36] >> 4), (4, 4), "MTUCap, NeighborMTU");
        let r = sw.sma(1, get(2)).expect("PortInfo of port 2");
        assert_eq!((r.data[41], r.data[36] >> 4), (5, 5));
        let mut set = Smp::lid_routed(2, method::SET, attr::PORT_INFO, 3);
        set.data[36] = 5 << 4;
        assert_eq!(sw.sma(1, set).expect("answered").hdr.status, 0);
        assert_eq!(sw.port(3).map(|p| p.neighbor_mtu), Some(4));
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
