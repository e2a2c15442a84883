//! A host node: a one-port channel adapter that the fabric itself models.
//!
//! A host node: a one-port channel adapter that the fabric itself models
//! (no HCA model, no driver), the attach point of the ibsim server's
//! clients (OpenSM, infiniband-diags) and a stand-in CA for tests. Its SMA
//! answers NodeInfo, NodeDescription, PortInfo (Get/Set, LID assignment
//! and the Down/Init/Armed/Active state machine), P_KeyTable, GUIDInfo,
//! Mellanox's ExtendedPortInfo (0xFF90, as a ConnectX-3 does),
//! SL-to-VL and VL arbitration tables (kept, not applied); its PMA answers
//! ClassPortInfo, PortCounters and PortCountersExtended; its MAD layer
//! answers a Get or Set that no client takes with status 0x000C
//! ([`HostNode::unsupported_reply`]). The subnet side
//! of the directed-route SMI at an end node is here too (IBTA 14.2.2:
//! C14-9 at the source and destination, C14-13 on the way back). Left out:
//! M_Key checking (the key is kept, and at protection level 1 reads 0 to
//! a Get without it, but never enforced), a second
//! port, multicast, traps other than 144 (sent when an SM client attaches
//! or leaves: [`HostNode::take_trap`]), and everything a real
//! HCA does for data traffic (a host node only carries MADs).
//!
//! Written from the IBTA attribute layouts (14.2.5, 16.1.3) with ibsim's
//! CA model as facts; nothing here comes from the driver crates.

use super::switch::PortCounters;
use super::{Fabric, Packet, PortId};
use super::{LogicalState, PhysicalState};
use crate::fabric::packet::{
    self, GSI_QKEY, MAD_LEN, MadHdr, PERMISSIVE_LID, Smp, attr, mad_status, method, mgmt_class,
};

/// P_Key table size (PartitionCap) of a host node.
pub const HOST_PKEYS: usize = 128;
/// CapabilityMask bit IsSM.
pub const CAP_IS_SM: u32 = 1 << 1;
/// The Notice attribute (traps).
const ATTR_NOTICE: u16 = 0x0002;
/// CapabilityMask of a host node without an SM: IsTrapSupported,
/// IsSLMappingSupported, IsSystemImageGUIDsupported,
/// IsCommunicationManagementSupported, IsCapabilityMaskNoticeSupported,
/// IsClientReregistrationSupported (like a ConnectX-3 port).
pub const HOST_CAP_MASK: u32 = 0x0241_0848;

/// One MAD with the addressing it travels with: what a `sim_request`
/// carries, and what a UD packet to QP0/QP1 carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mad {
    /// Destination LID (LRH).
    pub dlid: u16,
    /// Source LID (LRH).
    pub slid: u16,
    /// Destination QP.
    pub dqp: u32,
    /// Source QP.
    pub sqp: u32,
    /// Service level.
    pub sl: u8,
    /// P_Key.
    pub pkey: u16,
    /// Valid bytes of `data` (at most 256).
    pub len: usize,
    /// The MAD.
    pub data: [u8; MAD_LEN],
}

impl Mad {
    /// The common MAD header.
    pub fn hdr(&self) -> MadHdr {
        MadHdr::parse(&self.data).unwrap_or_default()
    }
    /// The transaction id.
    pub fn tid(&self) -> u64 {
        u64::from_be_bytes(self.data[8..16].try_into().unwrap_or([0; 8]))
    }
    /// Replaces the transaction id.
    pub fn set_tid(&mut self, tid: u64) {
        self.data[8..16].copy_from_slice(&tid.to_be_bytes());
    }
    /// Whether this MAD is a response: the method's R bit, or the D bit
    /// of a directed-route SMP.
    pub fn is_response(&self) -> bool {
        let h = self.hdr();
        h.method & 0x80 != 0
            || (h.mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE
                && h.status & mad_status::DIRECTION != 0)
    }
    /// Whether the sender waits for a response to this request (Get, Set,
    /// GetTable, GetTraceTable, GetMulti, Delete; Trap and Send do not).
    pub fn wants_response(&self) -> bool {
        let m = self.hdr().method;
        !self.is_response() && matches!(m, 0x01 | 0x02 | 0x06 | 0x12 | 0x13 | 0x14 | 0x15)
    }
    /// Whether this is an SMP (either class).
    pub fn is_smp(&self) -> bool {
        matches!(
            self.hdr().mgmt_class,
            mgmt_class::SUBN_LID_ROUTED | mgmt_class::SUBN_DIRECTED_ROUTE
        )
    }
}

/// What the node does with a MAD that reached it.
#[derive(Debug, PartialEq, Eq)]
pub enum Handled {
    /// The node's SMA or PMA answered: send this back.
    Reply(Mad),
    /// Not the SMA's or PMA's: for the node's clients (SM, SA, responses).
    Up(Mad),
    /// Dropped, for this reason.
    Drop(&'static str),
}

/// A one-port CA modelled by the fabric.
#[derive(Debug, Clone)]
pub struct HostNode {
    /// Node id (the net file's name; what `SIM_HOST` names).
    pub name: String,
    /// NodeDescription.
    pub description: String,
    /// NodeGUID; the port GUID is NodeGUID + 1.
    pub node_guid: u64,
    /// SystemImageGUID.
    pub sys_image_guid: u64,
    /// NodeInfo VendorID.
    pub vendor_id: u32,
    /// NodeInfo DeviceID.
    pub device_id: u16,
    /// NodeInfo Revision.
    pub revision: u32,
    /// The node's port on the fabric.
    pub port: PortId,
    /// PortInfo CapabilityMask (IsSM is set while an SM client is attached).
    pub cap_mask: u32,
    lid: u16,
    lmc: u8,
    sm_lid: u16,
    sm_sl: u8,
    mkey: u64,
    mkey_protect: u8,
    mkey_lease: u16,
    gid_prefix: u64,
    subnet_timeout: u8,
    state: LogicalState,
    phys: PhysicalState,
    neighbor_mtu: u8,
    op_vls: u8,
    pkeys: [u16; HOST_PKEYS],
    sl2vl: [u8; 8],
    vlarb: [[u8; 64]; 4],
    counters: PortCounters,
    link_gen: u64,
    mlnx_state_change_enable: u8,
    mlnx_speed_enabled: u8,
    /// The CapabilityMask changed: trap 144 is owed to the SM.
    trap_owed: bool,
    /// Traps sent (the low half of each trap's TID).
    traps_sent: u32,
}

impl HostNode {
    /// A host node on fabric port `port` (attached with
    /// [`Fabric::attach_hca_port`] by the caller or a topology); the port
    /// is enabled, so the link comes up when the cable is in.
    pub fn new(fabric: &mut Fabric, name: &str, node_guid: u64, port: PortId) -> HostNode {
        let _ = fabric.set_enabled(port, true);
        let mut pkeys = [0u16; HOST_PKEYS];
        pkeys[0] = 0xffff;
        let mut n = HostNode {
            name: name.into(),
            description: name.into(),
            node_guid,
            sys_image_guid: node_guid,
            vendor_id: super::switch::VENDOR_MELLANOX,
            device_id: 0x1003,
            revision: 1,
            port,
            cap_mask: HOST_CAP_MASK,
            lid: 0,
            lmc: 0,
            sm_lid: 0,
            sm_sl: 0,
            mkey: 0,
            mkey_protect: 0,
            mkey_lease: 0,
            gid_prefix: 0xfe80_0000_0000_0000,
            subnet_timeout: 0,
            state: LogicalState::Down,
            phys: PhysicalState::Polling,
            neighbor_mtu: 5,
            op_vls: 4,
            pkeys,
            sl2vl: [0; 8],
            vlarb: [[0; 64]; 4],
            counters: PortCounters::default(),
            link_gen: u64::MAX,
            mlnx_state_change_enable: 0,
            mlnx_speed_enabled: 0,
            trap_owed: false,
            traps_sent: 0,
        };
        n.sync_link(fabric);
        n
    }

    /// Port GUID (NodeGUID + 1, as ibsim and our HCA model number ports).
    pub fn port_guid(&self) -> u64 {
        self.node_guid.wrapping_add(1)
    }
    /// The port's LID (0 until an SM assigns one).
    pub fn lid(&self) -> u16 {
        self.lid
    }
    /// The SM's LID as the SM set it.
    pub fn sm_lid(&self) -> u16 {
        self.sm_lid
    }
    /// Logical port state.
    pub fn state(&self) -> LogicalState {
        self.state
    }
    /// Physical port state.
    pub fn phys_state(&self) -> PhysicalState {
        self.phys
    }
    /// The P_Key table.
    pub fn pkeys(&self) -> &[u16; HOST_PKEYS] {
        &self.pkeys
    }
    /// The PMA counters.
    pub fn counters(&self) -> PortCounters {
        self.counters
    }
    /// GID prefix.
    pub fn gid_prefix(&self) -> u64 {
        self.gid_prefix
    }

    /// Whether `dlid` is this port's (base LID and LMC range).
    pub fn owns_lid(&self, dlid: u16) -> bool {
        self.lid != 0
            && dlid >= self.lid
            && u32::from(dlid) < u32::from(self.lid) + (1u32 << self.lmc)
    }

    /// Follows the physical link: Down (Polling) without it, Init when it
    /// comes up.
    pub fn sync_link(&mut self, fabric: &Fabric) {
        let g = fabric.link_generation(self.port);
        if g == self.link_gen {
            return;
        }
        self.link_gen = g;
        if fabric.link_up(self.port) {
            if self.phys != PhysicalState::LinkUp {
                self.phys = PhysicalState::LinkUp;
                self.state = LogicalState::Init;
            }
        } else {
            if self.phys == PhysicalState::LinkUp {
                self.counters.link_downed += 1;
            }
            self.phys = PhysicalState::Polling;
            self.state = LogicalState::Down;
        }
    }

    /// NodeInfo as on the wire (LocalPortNum 1).
    pub fn node_info(&self) -> [u8; 64] {
        let mut o = [0u8; 64];
        o[0] = 1; // BaseVersion
        o[1] = 1; // ClassVersion
        o[2] = 1; // NodeType: channel adapter
        o[3] = 1; // NumPorts
        o[4..12].copy_from_slice(&self.sys_image_guid.to_be_bytes());
        o[12..20].copy_from_slice(&self.node_guid.to_be_bytes());
        o[20..28].copy_from_slice(&self.port_guid().to_be_bytes());
        o[28..30].copy_from_slice(&(HOST_PKEYS as u16).to_be_bytes());
        o[30..32].copy_from_slice(&self.device_id.to_be_bytes());
        o[32..36].copy_from_slice(&self.revision.to_be_bytes());
        let w = 1u32 << 24 | (self.vendor_id & 0xff_ffff);
        o[36..40].copy_from_slice(&w.to_be_bytes());
        o
    }

    /// PortInfo as on the wire (IBTA 14.2.5.6).
    pub fn port_info(&self) -> [u8; 64] {
        let mut o = [0u8; 64];
        o[0..8].copy_from_slice(&self.mkey.to_be_bytes());
        o[8..16].copy_from_slice(&self.gid_prefix.to_be_bytes());
        o[16..18].copy_from_slice(&self.lid.to_be_bytes());
        o[18..20].copy_from_slice(&self.sm_lid.to_be_bytes());
        o[20..24].copy_from_slice(&self.cap_mask.to_be_bytes());
        o[26..28].copy_from_slice(&self.mkey_lease.to_be_bytes());
        o[28] = 1; // LocalPortNum
        o[29] = 0x03; // LinkWidthEnabled 1x, 4x
        o[30] = 0x03; // LinkWidthSupported
        o[31] = 0x02; // LinkWidthActive 4x
        o[32] = 0x70 | self.state as u8; // speeds SDR/DDR/QDR | PortState
        o[33] = (self.phys as u8) << 4 | 2; // PhysState | LinkDownDefault Polling
        o[34] = self.mkey_protect << 6 | (self.lmc & 7);
        o[35] = 0x40 | 0x07; // active QDR | enabled SDR/DDR/QDR
        o[36] = self.neighbor_mtu << 4 | (self.sm_sl & 0xf);
        o[37] = 4 << 4; // VLCap VL0-7
        o[39] = 8; // VLArbitrationHighCap
        o[40] = 8; // VLArbitrationLowCap
        o[41] = 5; // MTUCap 4096
        o[42] = 0x1f; // HOQLife
        o[43] = self.op_vls << 4;
        o[50] = 1; // GUIDCap
        o[51] = self.subnet_timeout & 0x1f;
        o[52] = 0x10; // RespTimeValue
        o
    }

    /// SubnSet(PortInfo): subnet attributes and PortState (0 keeps it, 1
    /// is Down and the link retrains to Init, 3 is Armed from Init or
    /// Armed, 4 Active from Armed or Active; anything else is refused and
    /// changes nothing). ClientReregister is write-only.
    fn port_info_set(&mut self, d: &[u8; 64]) -> Result<(), u16> {
        let new_state = self
            .state
            .set_by_sm(d[32] & 0xf)
            .ok_or(mad_status::INVALID_FIELD)?;
        if !matches!(d[33] >> 4, 0 | 2) {
            // Disabling the port of a host node is not modelled.
            return Err(mad_status::INVALID_FIELD);
        }
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
        let nmtu = d[36] >> 4;
        if (1..=5).contains(&nmtu) {
            self.neighbor_mtu = nmtu;
        }
        let vls = d[43] >> 4;
        if (1..=4).contains(&vls) {
            self.op_vls = vls;
        }
        match new_state {
            Some(LogicalState::Down) => {
                self.state = if self.phys == PhysicalState::LinkUp {
                    LogicalState::Init
                } else {
                    LogicalState::Down
                };
            }
            Some(s) => self.state = s,
            None => {}
        }
        Ok(())
    }

    /// The SMA: the response to an SMP for this node, or `None` for what
    /// is the SM client's (SMInfo, traps, reports, responses).
    fn sma(&mut self, smp: &Smp) -> Option<Smp> {
        let meth = smp.hdr.method;
        if smp.hdr.attr_id == attr::SM_INFO
            || meth & 0x80 != 0
            || meth == method::TRAP
            || meth == method::REPORT
        {
            return None;
        }
        let mut r = smp.clone();
        r.hdr.method = method::GET_RESP;
        r.direction = smp.is_dr();
        r.hdr.status = if smp.hdr.class_version != 1 {
            mad_status::BAD_VERSION
        } else if meth == method::GET || meth == method::SET {
            self.attribute(meth == method::SET, smp, &mut r.data)
        } else {
            mad_status::METHOD_UNSUPPORTED
        };
        Some(r)
    }

    fn attribute(&mut self, set: bool, smp: &Smp, out: &mut [u8; 64]) -> u16 {
        let m = smp.hdr.attr_mod;
        let d = &smp.data;
        match (smp.hdr.attr_id, set) {
            (attr::NODE_DESC, false) => {
                out.fill(0);
                for (o, c) in out.iter_mut().zip(self.description.bytes()) {
                    *o = c;
                }
            }
            (attr::NODE_INFO, false) => *out = self.node_info(),
            (attr::PORT_INFO, _) => {
                // A CA answers for the port the SMP came in on; the
                // modifier's low byte is 0 or that port (bit 31 is the
                // SM's "extended speeds" flag).
                if m & 0xff > 1 {
                    return mad_status::INVALID_FIELD;
                }
                // Protection level 1 (IBTA 14.2.4.1): the M_Key field
                // reads 0 to a requester without the key.
                let hide = self.mkey != 0 && smp.mkey != self.mkey && self.mkey_protect == 1;
                let r = if set { self.port_info_set(d) } else { Ok(()) };
                *out = self.port_info();
                if hide {
                    out[0..8].fill(0);
                }
                if let Err(s) = r {
                    return s;
                }
            }
            (attr::PKEY_TABLE, _) => {
                let block = (m & 0xffff) as usize;
                if block >= HOST_PKEYS / 32 {
                    return mad_status::INVALID_FIELD;
                }
                let t = &mut self.pkeys[block * 32..block * 32 + 32];
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
                // GUIDCap 1: block 0, entry 0 is the port GUID (read-only).
                if m != 0 {
                    return mad_status::INVALID_FIELD;
                }
                out.fill(0);
                out[0..8].copy_from_slice(&self.port_guid().to_be_bytes());
            }
            (attr::MLNX_EXT_PORT_INFO, _) => {
                // As the switch answers it (`switch::mlnx_ext_port_info`).
                if m & 0xff > 1 || m >> 8 != 0 {
                    return mad_status::INVALID_FIELD;
                }
                if set {
                    self.mlnx_state_change_enable = d[3] & 1;
                    self.mlnx_speed_enabled = d[11] & super::switch::MLNX_SPEEDS_SUPPORTED;
                }
                *out = super::switch::mlnx_ext_port_info(
                    self.mlnx_state_change_enable,
                    self.mlnx_speed_enabled,
                );
            }
            (attr::SL_TO_VL_TABLE, _) => {
                if set {
                    self.sl2vl.copy_from_slice(&d[..8]);
                }
                out.fill(0);
                out[..8].copy_from_slice(&self.sl2vl);
            }
            (attr::VL_ARB_TABLE, _) => {
                let block = (m >> 16) as usize;
                if !(1..=4).contains(&block) {
                    return mad_status::INVALID_FIELD;
                }
                if set {
                    self.vlarb[block - 1] = *d;
                }
                *out = self.vlarb[block - 1];
            }
            _ => return mad_status::ATTR_UNSUPPORTED,
        }
        0
    }

    /// The PMA: the response to a PerfMgt request.
    fn pma(&mut self, m: &Mad) -> Mad {
        const D: usize = packet::PMA_DATA;
        let h = m.hdr();
        let mut r = m.clone();
        r.len = MAD_LEN;
        let status = if h.class_version != 1 {
            mad_status::BAD_VERSION
        } else {
            match (h.attr_id, h.method) {
                (attr::CLASS_PORT_INFO, method::GET) => {
                    r.data[D..].fill(0);
                    r.data[D] = 1;
                    r.data[D + 1] = 1;
                    // CapabilityMask: AllPortSelect, PortCountersExtended.
                    r.data[D + 2..D + 4].copy_from_slice(&0x0300u16.to_be_bytes());
                    r.data[D + 4..D + 8].copy_from_slice(&0x12u32.to_be_bytes());
                    0
                }
                (attr::PORT_COUNTERS | attr::PORT_COUNTERS_EXT, method::GET | method::SET) => {
                    let sel_port = r.data[D + 1];
                    let select = u16::from_be_bytes([r.data[D + 2], r.data[D + 3]]);
                    if !matches!(sel_port, 1 | 0xff) {
                        mad_status::INVALID_FIELD
                    } else {
                        let ext = h.attr_id == attr::PORT_COUNTERS_EXT;
                        if h.method == method::SET {
                            if ext {
                                super::switch::clear_ext(&mut self.counters, select);
                            } else {
                                super::switch::clear(&mut self.counters, select);
                            }
                        }
                        r.data[D..].fill(0);
                        r.data[D + 1] = sel_port;
                        r.data[D + 2..D + 4].copy_from_slice(&select.to_be_bytes());
                        if ext {
                            super::switch::encode_ext(&self.counters, &mut r.data[D..]);
                        } else {
                            super::switch::encode(&self.counters, &mut r.data[D..]);
                        }
                        0
                    }
                }
                (attr::CLASS_PORT_INFO | attr::PORT_COUNTERS | attr::PORT_COUNTERS_EXT, _) => {
                    mad_status::METHOD_UNSUPPORTED
                }
                _ => mad_status::ATTR_UNSUPPORTED,
            }
        };
        let mut rh = h;
        rh.method = method::GET_RESP;
        rh.status = status;
        rh.write(&mut r.data);
        r.dlid = m.slid;
        r.slid = self.lid;
        r.dqp = m.sqp;
        r.sqp = 1;
        r
    }

    /// A MAD that reached this node (after the SMI's end-node processing
    /// for directed route): answered by the SMA or PMA, or for the
    /// clients.
    pub fn handle(&mut self, m: &Mad) -> Handled {
        if m.is_response() {
            return Handled::Up(m.clone());
        }
        let h = m.hdr();
        if h.base_version != 1 {
            return Handled::Drop("MAD base version is not 1");
        }
        if m.is_smp() {
            if m.dqp != 0 {
                return Handled::Drop("SMP not for QP0");
            }
            let Ok(smp) = Smp::parse(&m.data) else {
                return Handled::Drop("short SMP");
            };
            let Some(resp) = self.sma(&smp) else {
                return Handled::Up(m.clone());
            };
            return Handled::Reply(self.reply_to(m, resp.to_bytes()));
        }
        if h.mgmt_class == mgmt_class::PERF_MGMT && m.dqp == 1 {
            return Handled::Reply(self.pma(m));
        }
        Handled::Up(m.clone())
    }

    /// `data` (a response MAD) addressed back to the sender of `m`: a
    /// directed-route SMP by the permissive LID (the SMI walks the return
    /// path), anything else to the requester's LID and QP from this
    /// port's LID and the QP `m` came to.
    fn reply_to(&self, m: &Mad, data: [u8; MAD_LEN]) -> Mad {
        let dr = m.hdr().mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE;
        let mut r = m.clone();
        r.data = data;
        r.len = MAD_LEN;
        (r.dlid, r.slid) = if dr {
            (PERMISSIVE_LID, PERMISSIVE_LID)
        } else {
            (m.slid, self.lid)
        };
        (r.dqp, r.sqp) = if m.is_smp() { (0, 0) } else { (m.sqp, m.dqp) };
        r
    }

    /// What the node's MAD layer does with a request no agent registered
    /// for (Linux `ib_mad.c`, `generate_unmatched_resp`): a Get or Set is
    /// answered with a GetResp carrying status 0x000C (unsupported
    /// method/attribute; for a directed-route SMP with the D bit set, so
    /// it returns along its path); any other method gets `None` and is
    /// dropped.
    pub fn unsupported_reply(&self, m: &Mad) -> Option<Mad> {
        let h = m.hdr();
        if m.is_response() || !matches!(h.method, method::GET | method::SET) {
            return None;
        }
        let mut data = m.data;
        let mut rh = h;
        rh.method = method::GET_RESP;
        rh.status = mad_status::ATTR_UNSUPPORTED;
        if h.mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE {
            rh.status |= mad_status::DIRECTION;
        }
        rh.write(&mut data);
        Some(self.reply_to(m, data))
    }

    /// Whether a MAD a client of this node sends stays in the node: a
    /// zero-hop directed-route SMP, or a LID-routed MAD to the node's own
    /// LID.
    pub fn is_local(&self, m: &Mad) -> bool {
        let h = m.hdr();
        if h.mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE {
            let dr_slid = u16::from_be_bytes([m.data[32], m.data[33]]);
            return h.class_specific & 0xff == 0
                && (dr_slid == PERMISSIVE_LID || self.owns_lid(m.dlid));
        }
        self.owns_lid(m.dlid)
    }

    /// Sends a MAD out of the node's port: for a directed-route SMP the
    /// source-side SMI first (a request leaves by InitialPath[1], a
    /// response by ReturnPath[HopCount]); the packet gets LRH, BTH and
    /// DETH (VL15 and Q_Key 0 for SMPs, VL0 and the GSI Q_Key otherwise).
    pub fn transmit(
        &mut self,
        fabric: &mut Fabric,
        now_ns: u64,
        m: &Mad,
    ) -> Result<(), &'static str> {
        self.sync_link(fabric);
        let mut data = m.data;
        let h = m.hdr();
        let (mut dlid, mut slid) = (m.dlid, if m.slid == 0 { self.lid } else { m.slid });
        if m.is_smp() {
            if m.dqp != 0 {
                return Err("SMP not addressed to QP0");
            }
            if h.mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE {
                let Ok(mut smp) = Smp::parse(&data) else {
                    return Err("short SMP");
                };
                let cnt = smp.hop_cnt;
                if cnt >= 64 {
                    return Err("directed route with more than 63 hops");
                }
                if smp.dr_dlid != PERMISSIVE_LID {
                    return Err("a LID-routed end of a directed route is not modelled");
                }
                if !smp.direction && smp.dr_slid != PERMISSIVE_LID {
                    // A directed route that starts at the node with LID
                    // `m.dlid`: LID routed there as it is (IBTA 14.2.2;
                    // the SMI there starts the directed part).
                    if smp.hop_ptr != 0 {
                        return Err("LID-routed start of a directed route with a hop pointer");
                    }
                    if m.dlid == 0 || m.dlid >= 0xc000 {
                        return Err("LID-routed start of a directed route to no unicast LID");
                    }
                } else {
                    if cnt == 0 {
                        return Err("directed route with no hop");
                    }
                    if !smp.direction {
                        if smp.hop_ptr != 0 {
                            return Err("outgoing SMP with a hop pointer (C14-9:1)");
                        }
                        if smp.initial_path[1] != 1 {
                            return Err("initial path leaves by a port the node lacks");
                        }
                        smp.hop_ptr = 1;
                    } else {
                        if smp.return_path[usize::from(cnt)] > 1 {
                            return Err("return path leaves by a port the node lacks");
                        }
                        smp.hop_ptr = cnt;
                    }
                    data = smp.to_bytes();
                    dlid = PERMISSIVE_LID;
                    slid = PERMISSIVE_LID;
                }
            }
        } else if m.dqp == 0 {
            return Err("a GMP addressed to QP0");
        } else {
            rmpp_single_segment(&mut data, m.len);
        }
        if self.phys != PhysicalState::LinkUp {
            return Err("link down");
        }
        let smi = m.is_smp();
        if !smi && !matches!(self.state, LogicalState::Armed | LogicalState::Active) {
            // IBTA 7.2: only SMPs leave a port that is not Armed/Active.
            return Err("port not Active");
        }
        let mut hdr = packet::mad_headers(dlid, slid, m.dqp, m.sqp, m.pkey);
        hdr.lrh.sl = m.sl;
        if let Some(d) = hdr.deth.as_mut()
            && !smi
        {
            d.qkey = GSI_QKEY;
        }
        let bytes = packet::build(&hdr, &data).map_err(|_| "MAD does not build into a packet")?;
        self.counters.xmit_pkts += 1;
        self.counters.xmit_data += (bytes.len().saturating_sub(packet::VCRC_LEN) / 4) as u64;
        if fabric.transmit(self.port, Packet { bytes }, now_ns) {
            Ok(())
        } else {
            self.counters.xmit_discards += 1;
            Err("the fabric refused the packet (link down or queue full)")
        }
    }

    /// Takes the next packet due at the node's port and turns it into a
    /// MAD, after the end-node checks (CRCs, VL15 only for QP0, the GSI
    /// Q_Key for QP1, a P_Key in the table) and the SMI's destination
    /// processing of directed-route SMPs. `Some(Err)` is a packet dropped
    /// (and counted).
    pub fn receive(
        &mut self,
        fabric: &mut Fabric,
        now_ns: u64,
    ) -> Option<Result<Mad, &'static str>> {
        self.sync_link(fabric);
        let pkt = fabric.receive(self.port, now_ns)?;
        self.counters.rcv_pkts += 1;
        self.counters.rcv_data += (pkt.bytes.len().saturating_sub(packet::VCRC_LEN) / 4) as u64;
        Some(self.accept(&pkt.bytes).inspect_err(|_| {
            self.counters.rcv_errors += 1;
        }))
    }

    fn accept(&mut self, b: &[u8]) -> Result<Mad, &'static str> {
        let p = packet::parse_checked(b).map_err(|_| "malformed packet or bad CRC")?;
        let h = p.hdr;
        let deth = h.deth.ok_or("not a datagram")?;
        let smi = h.lrh.vl == 15;
        if smi != (h.bth.dest_qp == 0) {
            return Err("VL15 and QP0 disagree");
        }
        if !smi {
            if h.bth.dest_qp != 1 || deth.qkey != GSI_QKEY {
                return Err("not a GMP for QP1 with the GSI Q_Key");
            }
            let pk = h.bth.pkey & 0x7fff;
            if !self.pkeys.iter().any(|&k| k != 0 && k & 0x7fff == pk) {
                return Err("P_Key not in the table");
            }
            if !matches!(self.state, LogicalState::Armed | LogicalState::Active) {
                return Err("GMP on a port that is not Armed or Active");
            }
        }
        let payload = p.payload(b);
        if payload.len() < 24 {
            return Err("short MAD");
        }
        let mut data = [0u8; MAD_LEN];
        let n = payload.len().min(MAD_LEN);
        data[..n].copy_from_slice(&payload[..n]);
        let mut m = Mad {
            dlid: h.lrh.dlid,
            slid: h.lrh.slid,
            dqp: h.bth.dest_qp,
            sqp: deth.src_qp,
            sl: h.lrh.sl,
            pkey: h.bth.pkey,
            len: n,
            data,
        };
        if smi && m.hdr().mgmt_class == mgmt_class::SUBN_DIRECTED_ROUTE {
            let mut smp = Smp::parse(&m.data).map_err(|_| "short SMP")?;
            let (ptr, cnt) = (smp.hop_ptr, smp.hop_cnt);
            if cnt >= 64 {
                return Err("hop count above 63");
            }
            if !smp.direction {
                if cnt == 0 || ptr != cnt {
                    return Err("directed-route SMP not at its end here (CA, C14-9)");
                }
                // C14-9:3: the end of the path; the response leaves by
                // the port this came in on.
                smp.return_path[usize::from(cnt)] = 1;
                smp.hop_ptr = cnt + 1;
            } else if ptr == 0 && smp.dr_slid != PERMISSIVE_LID && self.owns_lid(m.dlid) {
                // C14-13:4: the LID-routed last part brought it to the
                // requester (its DrSLID).
            } else {
                if ptr != 1 {
                    return Err("returning SMP not at its requester (C14-13)");
                }
                smp.hop_ptr = 0;
            }
            m.data = smp.to_bytes();
        } else if smi && !self.owns_lid(m.dlid) && m.dlid != PERMISSIVE_LID {
            return Err("LID-routed SMP for another LID");
        } else if !smi && !self.owns_lid(m.dlid) {
            return Err("GMP for another LID");
        }
        if !smi && let Some(len) = rmpp_single_length(&m.data) {
            m.len = len;
        }
        Ok(m)
    }

    /// The node's IsSM capability bit (an SM client attached or left). A
    /// change owes the SM a trap 144 ([`HostNode::take_trap`]), as ibsim
    /// sends one on SET_ISSM and a ConnectX-3 SMA on a new CapabilityMask:
    /// an SM only re-reads PortInfo in a heavy sweep, which the trap starts,
    /// so without it a master finds a new SM only at its next heavy sweep.
    pub fn set_is_sm(&mut self, on: bool) {
        let before = self.cap_mask;
        if on {
            self.cap_mask |= CAP_IS_SM;
        } else {
            self.cap_mask &= !CAP_IS_SM;
        }
        if self.cap_mask != before {
            self.trap_owed = true;
        }
    }

    /// Traps this node has sent.
    pub fn traps_sent(&self) -> u32 {
        self.traps_sent
    }

    /// The trap 144 (local changes: a new CapabilityMask) the node owes its
    /// SM, if any: a LID-routed SubnTrap(Notice) from the port's LID to the
    /// SM's, with IBTA 14.2.5.1's DataDetails (LIDADDR, OtherLocalChanges
    /// 0, the new CapabilityMask, no change flags). Only a port that is
    /// Active and knows its SM sends it; otherwise the change is simply
    /// read by the next sweep.
    pub fn take_trap(&mut self) -> Option<Mad> {
        if !std::mem::take(&mut self.trap_owed)
            || self.state != LogicalState::Active
            || self.sm_lid == 0
        {
            return None;
        }
        self.traps_sent = self.traps_sent.wrapping_add(1);
        let mut data = [0u8; MAD_LEN];
        MadHdr {
            base_version: 1,
            mgmt_class: mgmt_class::SUBN_LID_ROUTED,
            class_version: 1,
            method: method::TRAP,
            tid: 0x7100_0000 | u64::from(self.traps_sent),
            attr_id: ATTR_NOTICE,
            ..MadHdr::default()
        }
        .write(&mut data);
        let n = &mut data[64..128];
        n[0] = 0x80 | 4; // generic, informational
        n[1..4].copy_from_slice(&[0, 0, 1]); // ProducerType: CA
        n[4..6].copy_from_slice(&144u16.to_be_bytes());
        n[6..8].copy_from_slice(&self.lid.to_be_bytes());
        n[12..14].copy_from_slice(&self.lid.to_be_bytes());
        n[16..20].copy_from_slice(&self.cap_mask.to_be_bytes());
        Some(Mad {
            dlid: self.sm_lid,
            slid: self.lid,
            dqp: 0,
            sqp: 0,
            sl: self.sm_sl,
            pkey: 0xffff,
            len: MAD_LEN,
            data,
        })
    }
}

/// RMPP header fields (IBTA 13.6.2.1): in MAD bytes 24..36.
const RMPP_ACTIVE: u8 = 0x01;
const RMPP_FIRST: u8 = 0x02;
const RMPP_LAST: u8 = 0x04;
const RMPP_TYPE_DATA: u8 = 1;
/// MAD header plus RMPP header.
const RMPP_HDR_END: usize = 36;

/// What a kernel's RMPP layer does for a one-segment transfer that a
/// client (which, under umad2sim, has no kernel) leaves to it: a MAD with
/// RMPP active and `len` bytes gets RMPPVersion 1, type DATA, First and
/// Last, segment 1 and the payload length, so the receiver knows where
/// the data ends.
fn rmpp_single_segment(data: &mut [u8; MAD_LEN], len: usize) {
    if data[26] & RMPP_ACTIVE == 0 || len < RMPP_HDR_END {
        return;
    }
    if data[24] == 0 {
        data[24] = 1;
    }
    if data[25] == 0 {
        data[25] = RMPP_TYPE_DATA;
    }
    if data[25] != RMPP_TYPE_DATA {
        return;
    }
    data[26] |= RMPP_FIRST | RMPP_LAST;
    data[28..32].copy_from_slice(&1u32.to_be_bytes());
    data[32..36].copy_from_slice(&((len - RMPP_HDR_END) as u32).to_be_bytes());
}

/// The MAD length a one-segment RMPP DATA transfer says it has.
fn rmpp_single_length(data: &[u8; MAD_LEN]) -> Option<usize> {
    let f = data[26];
    if f & RMPP_ACTIVE == 0
        || data[25] != RMPP_TYPE_DATA
        || f & (RMPP_FIRST | RMPP_LAST) != (RMPP_FIRST | RMPP_LAST)
    {
        return None;
    }
    let pay = u32::from_be_bytes(data[32..36].try_into().ok()?) as usize;
    Some((RMPP_HDR_END + pay).min(MAD_LEN))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    fn pair() -> (Fabric, HostNode, PortId) {
        let mut f = Fabric::new();
        let a = f.attach_hca_port(0x10, 1);
        let b = f.attach_hca_port(0x20, 1);
        f.connect(a, b).unwrap();
        f.set_enabled(b, true).unwrap();
        let n = HostNode::new(&mut f, "n", 0x10, a);
        (f, n, b)
    }

    #[test]
    fn answers_a_directed_route_node_info_from_its_neighbour() {
        let (mut f, mut n, b) = pair();
        assert_eq!(n.state(), LogicalState::Init, "link up, no SM");
        let smp = Smp::dr_get(9, attr::NODE_INFO, 0, &[1]).unwrap();
        let mut s = smp.clone();
        s.hop_ptr = 1; // as the neighbour's SMI sends it
        let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, 0xffff);
        let bytes = packet::build(&h, &s.to_bytes()).unwrap();
        assert!(f.transmit(b, Packet { bytes }, 0));
        let m = n.receive(&mut f, 0).unwrap().unwrap();
        let Handled::Reply(r) = n.handle(&m) else {
            panic!("the SMA answers NodeInfo");
        };
        n.transmit(&mut f, 0, &r).unwrap();
        let back = f.receive(b, 0).expect("the response crossed back");
        let p = packet::parse_checked(&back.bytes).unwrap();
        let resp = Smp::parse(p.payload(&back.bytes)).unwrap();
        assert!(resp.direction && resp.hdr.method == method::GET_RESP);
        assert_eq!(resp.hop_ptr, 1, "leaves by ReturnPath[HopCount]");
        assert_eq!(resp.return_path[1], 1);
        assert_eq!(&resp.data[12..20], &0x10u64.to_be_bytes());
        assert_eq!(p.hdr.lrh.vl, 15);
    }

    /// What no client takes (here SMInfo: the node has no SM) is the MAD
    /// layer's: a DR Get comes back along its path with status 0x000C and
    /// the D bit; a GMP Send is dropped (no reply).
    #[test]
    fn an_unregistered_get_is_answered_with_status_0x000c() {
        let (mut f, mut n, b) = pair();
        let mut s = Smp::dr_get(0x77, attr::SM_INFO, 0, &[1]).unwrap();
        s.hop_ptr = 1;
        let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, 0xffff);
        assert!(f.transmit(
            b,
            Packet {
                bytes: packet::build(&h, &s.to_bytes()).unwrap()
            },
            0
        ));
        let m = n.receive(&mut f, 0).unwrap().unwrap();
        let Handled::Up(m) = n.handle(&m) else {
            panic!("SMInfo is not the SMA's");
        };
        let r = n.unsupported_reply(&m).expect("a Get is answered");
        n.transmit(&mut f, 0, &r).unwrap();
        let back = f.receive(b, 0).expect("the answer crossed back");
        let p = packet::parse_checked(&back.bytes).unwrap();
        let resp = Smp::parse(p.payload(&back.bytes)).unwrap();
        assert!(resp.direction, "D bit");
        assert_eq!(
            (resp.hdr.method, resp.hdr.status, resp.hdr.tid, resp.hop_ptr),
            (method::GET_RESP, mad_status::ATTR_UNSUPPORTED, 0x77, 1)
        );
        let mut send = m.clone();
        send.data[1] = mgmt_class::CM;
        send.data[3] = method::SEND;
        assert_eq!(n.unsupported_reply(&send), None, "a Send is dropped");
        send.data[3] = method::GET_RESP;
        assert_eq!(n.unsupported_reply(&send), None, "a response too");
    }

    #[test]
    fn random_packets_are_refused_without_panic() {
        let (mut f, mut n, b) = pair();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut accepted = 0;
        for i in 0..20_000u64 {
            let mut mad = [0u8; MAD_LEN];
            for w in mad.chunks_mut(8) {
                let r = rng(&mut seed).to_le_bytes();
                w.copy_from_slice(&r[..w.len()]);
            }
            // Mostly plausible headers, so the checks past parsing run.
            mad[0] = if i % 7 == 0 { 2 } else { 1 };
            mad[1] = [0x01, 0x81, 0x04, 0x03][(i % 4) as usize];
            mad[2] = 1;
            let dqp = if mad[1] & 0x7f == 1 { 0 } else { 1 };
            let mut h = packet::mad_headers(
                if i % 3 == 0 {
                    PERMISSIVE_LID
                } else {
                    (i % 5) as u16
                },
                1,
                dqp,
                0,
                0xffff,
            );
            if i % 11 == 0 {
                h.lrh.vl = 0;
            }
            let mut bytes = packet::build(&h, &mad).unwrap();
            if i % 13 == 0 {
                let k = (rng(&mut seed) as usize) % bytes.len();
                bytes[k] ^= 0x40; // a CRC error somewhere
            }
            f.transmit(b, Packet { bytes }, 0);
            while let Some(r) = n.receive(&mut f, 0) {
                if let Ok(m) = r {
                    accepted += 1;
                    if let Handled::Reply(r) = n.handle(&m) {
                        let _ = n.transmit(&mut f, 0, &r);
                    }
                }
            }
            while f.receive(b, 0).is_some() {}
        }
        assert!(accepted > 100, "some reached the SMA/PMA: {accepted}");
        assert!(n.counters().rcv_errors > 100, "and many were refused");
    }
}
