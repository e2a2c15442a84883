//! The attribute layouts an SM reads and writes, as OpenSM's `include/iba/ib_types.h` names them (IBTA vol. 1, 14.2.5 and 15.2.5).
//!
//! Each attribute is a plain byte array in wire order with accessors at the
//! IBTA's offsets; nothing here allocates or can index out of bounds (every
//! array has the attribute's size). The vendor attributes (Mellanox
//! ExtPortInfo), congestion control and the QoS tables are left out.

use hal::be::{get_be16, get_be32, get_be64, put_be16, put_be32, put_be64};

/// SMP attribute IDs (`IB_MAD_ATTR_*`, SM class).
pub mod attr {
    /// Notice (traps).
    pub const NOTICE: u16 = 0x0002;
    /// NodeDescription.
    pub const NODE_DESC: u16 = 0x0010;
    /// NodeInfo.
    pub const NODE_INFO: u16 = 0x0011;
    /// SwitchInfo.
    pub const SWITCH_INFO: u16 = 0x0012;
    /// GUIDInfo.
    pub const GUID_INFO: u16 = 0x0014;
    /// PortInfo.
    pub const PORT_INFO: u16 = 0x0015;
    /// P_KeyTable.
    pub const PKEY_TABLE: u16 = 0x0016;
    /// LinearForwardingTable.
    pub const LIN_FWD_TBL: u16 = 0x0019;
    /// MulticastForwardingTable.
    pub const MCAST_FWD_TBL: u16 = 0x001b;
    /// SMInfo.
    pub const SM_INFO: u16 = 0x0020;
}

/// SA attribute IDs (`IB_MAD_ATTR_*`, SA class).
pub mod sa_attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Notice.
    pub const NOTICE: u16 = 0x0002;
    /// InformInfo.
    pub const INFORM_INFO: u16 = 0x0003;
    /// NodeRecord.
    pub const NODE_RECORD: u16 = 0x0011;
    /// PortInfoRecord.
    pub const PORTINFO_RECORD: u16 = 0x0012;
    /// SLtoVLMappingTableRecord.
    pub const SLVL_RECORD: u16 = 0x0013;
    /// SwitchInfoRecord.
    pub const SWITCH_INFO_RECORD: u16 = 0x0014;
    /// LinearForwardingTableRecord.
    pub const LFT_RECORD: u16 = 0x0015;
    /// RandomForwardingTableRecord.
    pub const RFT_RECORD: u16 = 0x0016;
    /// MulticastForwardingTableRecord.
    pub const MFT_RECORD: u16 = 0x0017;
    /// SMInfoRecord.
    pub const SMINFO_RECORD: u16 = 0x0018;
    /// LinkRecord.
    pub const LINK_RECORD: u16 = 0x0020;
    /// GuidInfoRecord.
    pub const GUIDINFO_RECORD: u16 = 0x0030;
    /// ServiceRecord.
    pub const SERVICE_RECORD: u16 = 0x0031;
    /// P_KeyTableRecord.
    pub const PKEY_TBL_RECORD: u16 = 0x0033;
    /// PathRecord.
    pub const PATH_RECORD: u16 = 0x0035;
    /// VLArbitrationTableRecord.
    pub const VLARB_RECORD: u16 = 0x0036;
    /// MCMemberRecord.
    pub const MCMEMBER_RECORD: u16 = 0x0038;
    /// TraceRecord.
    pub const TRACE_RECORD: u16 = 0x0039;
    /// MultiPathRecord.
    pub const MULTIPATH_RECORD: u16 = 0x003a;
    /// InformInfoRecord.
    pub const INFORM_INFO_RECORD: u16 = 0x00f3;
}

/// SA methods beyond the common ones (`IB_MAD_METHOD_*`).
pub mod sa_method {
    /// GetTable.
    pub const GET_TABLE: u8 = 0x12;
    /// GetTableResp.
    pub const GET_TABLE_RESP: u8 = 0x92;
    /// GetTraceTable.
    pub const GET_TRACE_TABLE: u8 = 0x13;
    /// GetMulti.
    pub const GET_MULTI: u8 = 0x14;
    /// GetMultiResp.
    pub const GET_MULTI_RESP: u8 = 0x94;
    /// Delete.
    pub const DELETE: u8 = 0x15;
    /// DeleteResp.
    pub const DELETE_RESP: u8 = 0x95;
}

/// MAD status values the SM and SA answer with (`IB_MAD_STATUS_*`,
/// `IB_SA_MAD_STATUS_*`), host order.
pub mod status {
    /// Bad class version.
    pub const UNSUP_CLASS_VER: u16 = 0x0004;
    /// Method not supported.
    pub const UNSUP_METHOD: u16 = 0x0008;
    /// Method/attribute combination not supported.
    pub const UNSUP_METHOD_ATTR: u16 = 0x000c;
    /// Invalid attribute value or modifier.
    pub const INVALID_FIELD: u16 = 0x001c;
    /// SA: no resources.
    pub const SA_NO_RESOURCES: u16 = 0x0100;
    /// SA: request invalid.
    pub const SA_REQ_INVALID: u16 = 0x0200;
    /// SA: no records.
    pub const SA_NO_RECORDS: u16 = 0x0300;
    /// SA: too many records.
    pub const SA_TOO_MANY_RECORDS: u16 = 0x0400;
    /// SA: invalid GID.
    pub const SA_INVALID_GID: u16 = 0x0500;
    /// SA: insufficient components.
    pub const SA_INSUF_COMPS: u16 = 0x0600;
    /// SA: denied.
    pub const SA_DENIED: u16 = 0x0700;
}

/// SMInfo states (`IB_SMINFO_STATE_*`).
pub mod sm_state {
    /// Not active.
    pub const NOTACTIVE: u8 = 0;
    /// Discovering.
    pub const DISCOVERING: u8 = 1;
    /// Standby.
    pub const STANDBY: u8 = 2;
    /// Master.
    pub const MASTER: u8 = 3;
}

/// SubnSet(SMInfo) attribute modifiers (`IB_SMINFO_ATTR_MOD_*`).
pub mod sminfo_mod {
    /// Handover.
    pub const HANDOVER: u32 = 1;
    /// Acknowledge.
    pub const ACKNOWLEDGE: u32 = 2;
    /// Disable.
    pub const DISABLE: u32 = 3;
    /// Standby.
    pub const STANDBY: u32 = 4;
    /// Discover.
    pub const DISCOVER: u32 = 5;
}

/// PortInfo CapabilityMask bits (`IB_PORT_CAP_*`).
pub mod cap {
    /// IsSM.
    pub const IS_SM: u32 = 1 << 1;
    /// IsSMDisabled.
    pub const IS_SM_DISABLED: u32 = 1 << 10;
    /// IsClientReregistrationSupported.
    pub const HAS_CLIENT_REREG: u32 = 1 << 25;
}

/// Port states (`IB_LINK_*`).
pub mod link {
    /// No state change (in a Set).
    pub const NO_CHANGE: u8 = 0;
    /// Down.
    pub const DOWN: u8 = 1;
    /// Initialize.
    pub const INIT: u8 = 2;
    /// Armed.
    pub const ARMED: u8 = 3;
    /// Active.
    pub const ACTIVE: u8 = 4;
}

/// Node types.
pub mod node_type {
    /// Channel adapter.
    pub const CA: u8 = 1;
    /// Switch.
    pub const SWITCH: u8 = 2;
    /// Router.
    pub const ROUTER: u8 = 3;
}

/// The permissive LID.
pub const PERMISSIVE_LID: u16 = 0xffff;
/// The largest unicast LID.
pub const MAX_UCAST_LID: u16 = 0xbfff;
/// The first multicast LID.
pub const MCAST_LID_BASE: u16 = 0xc000;
/// An LFT entry that leads nowhere.
pub const LFT_NO_PATH: u8 = 0xff;
/// The link-local subnet prefix.
pub const LINK_LOCAL_PREFIX: u64 = 0xfe80_0000_0000_0000;

macro_rules! acc {
    ($get:ident, $set:ident, be16, $o:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u16 {
            get_be16(&self.0, $o)
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u16) {
            put_be16(&mut self.0, $o, v)
        }
    };
    ($get:ident, $set:ident, be32, $o:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u32 {
            get_be32(&self.0, $o)
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u32) {
            put_be32(&mut self.0, $o, v)
        }
    };
    ($get:ident, $set:ident, be64, $o:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u64 {
            get_be64(&self.0, $o)
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u64) {
            put_be64(&mut self.0, $o, v)
        }
    };
    ($get:ident, $set:ident, hi4, $o:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u8 {
            self.0[$o] >> 4
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u8) {
            self.0[$o] = (self.0[$o] & 0x0f) | (v << 4);
        }
    };
    ($get:ident, $set:ident, lo4, $o:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u8 {
            self.0[$o] & 0x0f
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u8) {
            self.0[$o] = (self.0[$o] & 0xf0) | (v & 0x0f);
        }
    };
    ($get:ident, $set:ident, u8, $o:expr, $doc:literal) => {
        #[doc = $doc]
        pub fn $get(&self) -> u8 {
            self.0[$o]
        }
        #[doc = concat!("Sets: ", $doc)]
        pub fn $set(&mut self, v: u8) {
            self.0[$o] = v;
        }
    };
}

/// NodeInfo (`ib_node_info_t`, 40 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo(pub [u8; 40]);

impl NodeInfo {
    /// From the first 40 bytes of SMP data.
    pub fn from_smp(d: &[u8]) -> NodeInfo {
        let mut n = [0u8; 40];
        let k = d.len().min(40);
        n[..k].copy_from_slice(&d[..k]);
        NodeInfo(n)
    }
    acc!(node_type, set_node_type, u8, 2, "NodeType.");
    acc!(num_ports, set_num_ports, u8, 3, "NumPorts.");
    acc!(sys_guid, set_sys_guid, be64, 4, "SystemImageGUID.");
    acc!(node_guid, set_node_guid, be64, 12, "NodeGUID.");
    acc!(port_guid, set_port_guid, be64, 20, "PortGUID.");
    acc!(partition_cap, set_partition_cap, be16, 28, "PartitionCap.");
    acc!(device_id, set_device_id, be16, 30, "DeviceID.");
    acc!(local_port_num, set_local_port_num, u8, 36, "LocalPortNum.");
    /// VendorID (24 bits).
    pub fn vendor_id(&self) -> u32 {
        u32::from_be_bytes([0, self.0[37], self.0[38], self.0[39]])
    }
}

/// PortInfo (`ib_port_info_t`, 64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo(pub [u8; 64]);

impl Default for PortInfo {
    fn default() -> Self {
        PortInfo([0; 64])
    }
}

impl PortInfo {
    /// From the 64 bytes of SMP data.
    pub fn from_smp(d: &[u8]) -> PortInfo {
        let mut n = [0u8; 64];
        let k = d.len().min(64);
        n[..k].copy_from_slice(&d[..k]);
        PortInfo(n)
    }
    acc!(m_key, set_m_key, be64, 0, "M_Key.");
    acc!(subnet_prefix, set_subnet_prefix, be64, 8, "GidPrefix.");
    acc!(base_lid, set_base_lid, be16, 16, "LID.");
    acc!(master_sm_lid, set_master_sm_lid, be16, 18, "MasterSMLID.");
    acc!(
        capability_mask,
        set_capability_mask,
        be32,
        20,
        "CapabilityMask."
    );
    acc!(m_key_lease, set_m_key_lease, be16, 26, "M_KeyLeasePeriod.");
    acc!(local_port_num, set_local_port_num, u8, 28, "LocalPortNum.");
    acc!(
        link_width_enabled,
        set_link_width_enabled,
        u8,
        29,
        "LinkWidthEnabled."
    );
    acc!(
        link_width_supported,
        set_link_width_supported,
        u8,
        30,
        "LinkWidthSupported."
    );
    acc!(
        link_width_active,
        set_link_width_active,
        u8,
        31,
        "LinkWidthActive."
    );
    acc!(
        link_speed_supported,
        set_link_speed_supported,
        hi4,
        32,
        "LinkSpeedSupported."
    );
    acc!(port_state, set_port_state, lo4, 32, "PortState.");
    acc!(phys_state, set_phys_state, hi4, 33, "PortPhysicalState.");
    acc!(
        link_down_def,
        set_link_down_def,
        lo4,
        33,
        "LinkDownDefaultState."
    );
    acc!(
        link_speed_active,
        set_link_speed_active,
        hi4,
        35,
        "LinkSpeedActive."
    );
    acc!(
        link_speed_enabled,
        set_link_speed_enabled,
        lo4,
        35,
        "LinkSpeedEnabled."
    );
    acc!(neighbor_mtu, set_neighbor_mtu, hi4, 36, "NeighborMTU.");
    acc!(master_sm_sl, set_master_sm_sl, lo4, 36, "MasterSMSL.");
    acc!(vl_cap, set_vl_cap, hi4, 37, "VLCap.");
    acc!(mtu_cap, set_mtu_cap, lo4, 41, "MTUCap.");
    acc!(op_vls, set_op_vls, hi4, 43, "OperationalVLs.");
    acc!(
        error_threshold,
        set_error_threshold,
        u8,
        53,
        "LocalPhyErrors | OverrunErrors thresholds."
    );
    /// M_KeyProtectBits (2 bits).
    pub fn mpb(&self) -> u8 {
        self.0[34] >> 6
    }
    /// LMC (3 bits).
    pub fn lmc(&self) -> u8 {
        self.0[34] & 7
    }
    /// Sets M_KeyProtectBits and LMC (the byte's reserved bits cleared).
    pub fn set_mpb_lmc(&mut self, mpb: u8, lmc: u8) {
        self.0[34] = (mpb & 3) << 6 | (lmc & 7);
    }
    /// VLStallCount (3 bits) and HOQLife (5 bits).
    pub fn set_stall_hoq(&mut self, stall: u8, hoq: u8) {
        self.0[42] = (stall & 7) << 5 | (hoq & 0x1f);
    }
    /// SubnetTimeOut (5 bits).
    pub fn subnet_timeout(&self) -> u8 {
        self.0[51] & 0x1f
    }
    /// Sets SubnetTimeOut and ClientReregister.
    pub fn set_timeout_rereg(&mut self, timeout: u8, rereg: bool) {
        self.0[51] = (timeout & 0x1f) | if rereg { 0x80 } else { 0 };
    }
    /// ClientReregister.
    pub fn client_rereg(&self) -> bool {
        self.0[51] & 0x80 != 0
    }
    /// Whether the port has a link that trains (PhysState LinkUp and a
    /// state above Down).
    pub fn link_up(&self) -> bool {
        self.port_state() >= link::INIT && self.phys_state() == 5
    }
    /// The IBTA rate code of the link (`ib_port_info_compute_rate`):
    /// LinkWidthActive x LinkSpeedExtActive where the CapabilityMask says
    /// the port has extended speeds (IsExtendedSpeedsSupported) and one is
    /// active, else LinkWidthActive x LinkSpeedActive. A switch's external
    /// port (CapabilityMask 0) goes by its port 0's: [`PortInfo::rate_ext`].
    pub fn rate(&self) -> u8 {
        self.rate_ext(self.capability_mask() & CAP_HAS_EXT_SPEEDS != 0)
    }
    /// [`PortInfo::rate`] with whether extended speeds count given.
    pub fn rate_ext(&self, extended: bool) -> u8 {
        // Rate codes by width: 1x, 2x, 4x, 8x, 12x.
        let by_width = |codes: [u8; 5]| match self.link_width_active() {
            16 => codes[1],
            2 => codes[2],
            4 => codes[3],
            8 => codes[4],
            _ => codes[0],
        };
        if extended {
            // LinkSpeedExtActive: 14.0625 (FDR), 25.78125 (EDR), 53.125 Gb/s.
            match self.0[62] >> 4 {
                1 => return by_width([11, 19, 12, 13, 14]),
                2 => return by_width([15, 20, 16, 17, 18]),
                4 => return by_width([20, 16, 17, 21, 22]),
                _ => {}
            }
        }
        match self.link_speed_active() {
            2 => by_width([5, 3, 6, 7, 8]),
            4 => by_width([3, 6, 7, 9, 10]),
            _ => by_width([2, 5, 3, 6, 4]),
        }
    }
}

/// PortInfo CapabilityMask IsExtendedSpeedsSupported.
pub const CAP_HAS_EXT_SPEEDS: u32 = 0x4000;

/// A rate code's tenths of Gb/s for ordering, 0 if unknown (OpenSM's
/// `ordered_rates`: a 64b/66b-coded rate by its 8b/10b equivalent, 56 Gb/s
/// as 68).
pub fn rate_value(code: u8) -> u32 {
    match code {
        2 => 25,
        5 => 50,
        3 => 100,
        11 => 170,
        6 => 200,
        4 => 300,
        15 => 312,
        19 => 350,
        7 => 400,
        8 => 600,
        20 => 625,
        12 => 680,
        9 => 800,
        10 => 1200,
        16 => 1250,
        13 => 1360,
        14 => 2040,
        17 => 2500,
        18 => 3750,
        21 => 5000,
        22 => 7500,
        _ => 0,
    }
}

/// The rate codes from slowest to fastest, in OpenSM's order.
pub const RATES: [u8; 21] = [
    2, 5, 3, 11, 6, 4, 15, 19, 7, 8, 20, 12, 9, 10, 16, 13, 14, 17, 18, 21, 22,
];

/// Whether a rate code is one OpenSM 3.3.23 knows (`ib_rate_is_valid`:
/// 2.5 to 600 Gb/s).
pub fn rate_is_valid(code: u8) -> bool {
    (2..=22).contains(&code)
}

/// Whether an MTU code is one the IBTA defines (`ib_mtu_is_valid`).
pub fn mtu_is_valid(code: u8) -> bool {
    (1..=5).contains(&code)
}

/// SwitchInfo (`ib_switch_info_t`, 20 bytes; the SMP carries 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchInfo(pub [u8; 64]);

impl SwitchInfo {
    /// From the 64 bytes of SMP data.
    pub fn from_smp(d: &[u8]) -> SwitchInfo {
        let mut n = [0u8; 64];
        let k = d.len().min(64);
        n[..k].copy_from_slice(&d[..k]);
        SwitchInfo(n)
    }
    acc!(lin_cap, set_lin_cap, be16, 0, "LinearFDBCap.");
    acc!(mcast_cap, set_mcast_cap, be16, 4, "MulticastFDBCap.");
    acc!(lin_top, set_lin_top, be16, 6, "LinearFDBTop.");
    acc!(
        life_state,
        set_life_state,
        u8,
        11,
        "LifeTimeValue, PortStateChange, OptimizedSLtoVL."
    );
    acc!(mcast_top, set_mcast_top, be16, 18, "MulticastFDBTop.");
    /// PortStateChange.
    pub fn port_state_change(&self) -> bool {
        self.0[11] & 0x04 != 0
    }
    /// EnhancedPort0.
    pub fn enhanced_port0(&self) -> bool {
        self.0[16] & 0x08 != 0
    }
}

/// SMInfo (`ib_sm_info_t`, 21 bytes; the SMP carries 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmInfo {
    /// The SM's port GUID.
    pub guid: u64,
    /// SM_Key.
    pub sm_key: u64,
    /// ActCount.
    pub act_count: u32,
    /// Priority (0..15).
    pub priority: u8,
    /// SMState.
    pub state: u8,
}

impl SmInfo {
    /// Reads it from SMP data.
    pub fn read(d: &[u8]) -> SmInfo {
        if d.len() < 21 {
            return SmInfo::default();
        }
        SmInfo {
            guid: get_be64(d, 0),
            sm_key: get_be64(d, 8),
            act_count: get_be32(d, 16),
            priority: d[20] >> 4,
            state: d[20] & 0xf,
        }
    }
    /// Writes it into SMP data (at least 21 bytes).
    pub fn write(&self, d: &mut [u8]) {
        if d.len() < 21 {
            return;
        }
        put_be64(d, 0, self.guid);
        put_be64(d, 8, self.sm_key);
        put_be32(d, 16, self.act_count);
        d[20] = (self.priority & 0xf) << 4 | (self.state & 0xf);
    }
}

/// `osm_sm_is_greater_than`: whether an SM of priority `p1` and port GUID
/// `g1` wins over one of `p2`, `g2` (higher priority, then lower GUID).
pub fn sm_is_greater_than(p1: u8, g1: u64, p2: u8, g2: u64) -> bool {
    p1 > p2 || (p1 == p2 && g1 < g2)
}

/// The words OpenSM uses for SM states (`osm_get_sm_mgr_state_str`).
pub fn sm_state_str(s: u8) -> &'static str {
    match s {
        sm_state::NOTACTIVE => "NOT ACTIVE",
        sm_state::DISCOVERING => "DISCOVERING",
        sm_state::STANDBY => "STANDBY",
        sm_state::MASTER => "MASTER",
        _ => "UNKNOWN STATE",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_info_fields_sit_at_ibta_offsets() {
        let mut p = PortInfo::default();
        p.set_base_lid(0x1234);
        p.set_master_sm_lid(0x0001);
        p.set_port_state(link::ARMED);
        p.set_link_speed_supported(7);
        p.set_neighbor_mtu(5);
        p.set_master_sm_sl(3);
        p.set_op_vls(4);
        p.set_timeout_rereg(18, true);
        p.set_mpb_lmc(1, 2);
        assert_eq!(&p.0[16..20], &[0x12, 0x34, 0, 1]);
        assert_eq!(p.0[32], 0x73);
        assert_eq!(p.0[36], 0x53);
        assert_eq!(p.0[43], 0x40);
        assert_eq!(p.0[51], 0x80 | 18);
        assert_eq!(p.0[34], 0x42);
        assert!(p.client_rereg() && p.subnet_timeout() == 18);
        p.0[31] = 2;
        p.0[35] = 0x40;
        assert_eq!(p.rate(), 7, "4x QDR: 40 Gb/s");
        // 4x FDR: 56 Gb/s where the port says it has extended speeds.
        p.0[62] = 0x11;
        assert_eq!(p.rate(), 7);
        p.set_capability_mask(CAP_HAS_EXT_SPEEDS);
        assert_eq!(p.rate(), 12, "4x FDR: 56 Gb/s");
        assert_eq!(p.rate_ext(false), 7);
        assert!(rate_value(12) > rate_value(7) && rate_value(11) < rate_value(6));
    }

    #[test]
    fn sminfo_round_trip_and_order() {
        let s = SmInfo {
            guid: 0x11,
            sm_key: 1,
            act_count: 7,
            priority: 5,
            state: sm_state::MASTER,
        };
        let mut d = [0u8; 64];
        s.write(&mut d);
        assert_eq!(d[20], 0x53);
        assert_eq!(SmInfo::read(&d), s);
        assert!(sm_is_greater_than(5, 9, 4, 1), "priority first");
        assert!(sm_is_greater_than(5, 1, 5, 9), "then the lower GUID");
        assert!(!sm_is_greater_than(5, 9, 5, 9), "never greater than itself");
        assert_eq!(SmInfo::read(&d[..3]), SmInfo::default(), "short data");
    }
}
