//! Port of Linux `include/rdma/ib_sa.h` (3.11): the SA MAD header, attribute IDs, methods, status codes, component masks and the PathRecord, NodeRecord, PortInfoRecord and MCMemberRecord layouts.
//!
//! Layouts: IBTA Vol. 1 15.2.5 (PathRecord 15.2.5.16, NodeRecord 15.2.5.2,
//! PortInfoRecord 15.2.5.3, MCMemberRecord 15.2.5.17), checked against
//! Linux's `path_rec_table`/`mcmember_rec_table` and OpenSM's `ib_types.h`
//! as facts. ServiceRecord, InformInfo and the other records are left out.

use crate::error::{Error, Result};
use crate::mad::{Mad, class};
use crate::verbs::Gid;
use hal::be::{get_be16, get_be32, get_be64};

/// SA class version (`IB_SA_CLASS_VERSION`).
pub const IB_SA_CLASS_VERSION: u8 = 2;
/// Offset of the SA data in a MAD (after the MAD, RMPP and SA headers).
pub const IB_SA_DATA_OFFSET: usize = 56;
/// Bytes of SA data in one MAD.
pub const IB_SA_DATA_SIZE: usize = 200;

/// SA attribute IDs (`IB_SA_ATTR_*`).
pub mod sa_attr {
    /// NodeRecord.
    pub const NODE_REC: u16 = 0x0011;
    /// PortInfoRecord.
    pub const PORT_INFO_REC: u16 = 0x0012;
    /// PathRecord.
    pub const PATH_REC: u16 = 0x0035;
    /// MCMemberRecord.
    pub const MC_MEMBER_REC: u16 = 0x0038;
}

/// SA methods beyond the common ones (`IB_SA_METHOD_*`).
pub mod sa_method {
    /// GetTable.
    pub const GET_TABLE: u8 = 0x12;
    /// GetTableResp.
    pub const GET_TABLE_RESP: u8 = 0x92;
    /// Delete.
    pub const DELETE: u8 = 0x15;
    /// DeleteResp.
    pub const DELETE_RESP: u8 = 0x95;
}

/// SA class-specific status codes (MAD status bits 14:8, IBTA 15.2.1.1).
pub mod sa_status {
    /// ERR_NO_RESOURCES.
    pub const NO_RESOURCES: u16 = 1;
    /// ERR_REQ_INVALID.
    pub const REQ_INVALID: u16 = 2;
    /// ERR_NO_RECORDS.
    pub const NO_RECORDS: u16 = 3;
    /// ERR_REQ_TOO_MANY_RECORDS.
    pub const TOO_MANY_RECORDS: u16 = 4;
    /// ERR_REQ_INVALID_GID.
    pub const INVALID_GID: u16 = 5;
    /// ERR_REQ_INSUFFICIENT_COMPONENTS.
    pub const INSUFFICIENT_COMPONENTS: u16 = 6;
    /// ERR_REQ_DENIED.
    pub const REQ_DENIED: u16 = 7;
}

/// The name of a MAD status as the SA uses it: the common bits (busy,
/// unsupported method or attribute, invalid value) or the SA's own code in
/// bits 14:8 (IBTA 15.2.1.1), as OpenSM's `ib_get_sa_status_str` words
/// them; `None` for 0 and for codes without a name.
pub fn sa_status_str(st: u16) -> Option<&'static str> {
    use crate::mad::status;
    let code = (st >> 8) & 0x7f;
    Some(match code {
        0 => match st & 0x1f {
            status::BUSY => "busy",
            0x04 => "bad base or class version",
            0x08 => "method not supported",
            0x0c => "method/attribute combination not supported",
            0x1c => "invalid attribute or modifier",
            _ => return None,
        },
        sa_status::NO_RESOURCES => "ERR_NO_RESOURCES (insufficient resources)",
        sa_status::REQ_INVALID => "ERR_REQ_INVALID (request invalid or refused)",
        sa_status::NO_RECORDS => "ERR_NO_RECORDS (no matching record)",
        sa_status::TOO_MANY_RECORDS => "ERR_REQ_TOO_MANY_RECORDS",
        sa_status::INVALID_GID => "ERR_REQ_INVALID_GID",
        sa_status::INSUFFICIENT_COMPONENTS => {
            "ERR_REQ_INSUFFICIENT_COMPONENTS (component mask lacks fields the SA needs)"
        }
        sa_status::REQ_DENIED => "ERR_REQ_DENIED",
        _ => return None,
    })
}

/// PathRecord component mask bits (`IB_SA_PATH_REC_*`, IBTA order).
pub mod path_comp {
    /// ServiceID (both bits of the 64-bit field, as Linux).
    pub const SERVICE_ID: u64 = 0b11;
    /// DGID.
    pub const DGID: u64 = 1 << 2;
    /// SGID.
    pub const SGID: u64 = 1 << 3;
    /// DLID.
    pub const DLID: u64 = 1 << 4;
    /// SLID.
    pub const SLID: u64 = 1 << 5;
    /// RawTraffic.
    pub const RAW_TRAFFIC: u64 = 1 << 6;
    /// FlowLabel.
    pub const FLOW_LABEL: u64 = 1 << 8;
    /// HopLimit.
    pub const HOP_LIMIT: u64 = 1 << 9;
    /// TClass.
    pub const TRAFFIC_CLASS: u64 = 1 << 10;
    /// Reversible.
    pub const REVERSIBLE: u64 = 1 << 11;
    /// NumbPath.
    pub const NUMB_PATH: u64 = 1 << 12;
    /// P_Key.
    pub const PKEY: u64 = 1 << 13;
    /// QoSClass.
    pub const QOS_CLASS: u64 = 1 << 14;
    /// SL.
    pub const SL: u64 = 1 << 15;
    /// MtuSelector.
    pub const MTU_SELECTOR: u64 = 1 << 16;
    /// MTU.
    pub const MTU: u64 = 1 << 17;
    /// RateSelector.
    pub const RATE_SELECTOR: u64 = 1 << 18;
    /// Rate.
    pub const RATE: u64 = 1 << 19;
    /// PacketLifeTimeSelector.
    pub const PACKET_LIFE_TIME_SELECTOR: u64 = 1 << 20;
    /// PacketLifeTime.
    pub const PACKET_LIFE_TIME: u64 = 1 << 21;
    /// Preference.
    pub const PREFERENCE: u64 = 1 << 22;
}

/// NodeRecord component mask bits (`IB_NR_COMPMASK_*` in OpenSM).
pub mod node_comp {
    /// LID.
    pub const LID: u64 = 1 << 0;
    /// NodeType.
    pub const NODE_TYPE: u64 = 1 << 4;
    /// NodeGUID.
    pub const NODE_GUID: u64 = 1 << 7;
    /// PortGUID.
    pub const PORT_GUID: u64 = 1 << 8;
    /// NodeDescription.
    pub const NODE_DESC: u64 = 1 << 14;
}

/// PortInfoRecord component mask bits (`IB_PIR_COMPMASK_*` in OpenSM).
pub mod portinfo_comp {
    /// EndportLID.
    pub const LID: u64 = 1 << 0;
    /// PortNum.
    pub const PORT_NUM: u64 = 1 << 1;
    /// Options (reserved in IBTA 1.2).
    pub const OPTIONS: u64 = 1 << 2;
}

/// MCMemberRecord component mask bits (`IB_SA_MCMEMBER_REC_*`, IBTA
/// order).
pub mod mcmember_comp {
    /// MGID.
    pub const MGID: u64 = 1 << 0;
    /// PortGID.
    pub const PORT_GID: u64 = 1 << 1;
    /// Q_Key.
    pub const QKEY: u64 = 1 << 2;
    /// MLID.
    pub const MLID: u64 = 1 << 3;
    /// MTUSelector.
    pub const MTU_SELECTOR: u64 = 1 << 4;
    /// MTU.
    pub const MTU: u64 = 1 << 5;
    /// TClass.
    pub const TRAFFIC_CLASS: u64 = 1 << 6;
    /// P_Key.
    pub const PKEY: u64 = 1 << 7;
    /// RateSelector.
    pub const RATE_SELECTOR: u64 = 1 << 8;
    /// Rate.
    pub const RATE: u64 = 1 << 9;
    /// PacketLifeTimeSelector.
    pub const PACKET_LIFE_TIME_SELECTOR: u64 = 1 << 10;
    /// PacketLifeTime.
    pub const PACKET_LIFE_TIME: u64 = 1 << 11;
    /// SL.
    pub const SL: u64 = 1 << 12;
    /// FlowLabel.
    pub const FLOW_LABEL: u64 = 1 << 13;
    /// HopLimit.
    pub const HOP_LIMIT: u64 = 1 << 14;
    /// Scope.
    pub const SCOPE: u64 = 1 << 15;
    /// JoinState.
    pub const JOIN_STATE: u64 = 1 << 16;
    /// ProxyJoin.
    pub const PROXY_JOIN: u64 = 1 << 17;

    /// What Linux's IPoIB asks to join the broadcast group with
    /// (`ipoib_mcast_join`, the `mcast == priv->broadcast` case): the group
    /// must exist already (the SM makes it).
    pub const IPOIB_BCAST_JOIN: u64 = MGID | PORT_GID | PKEY | JOIN_STATE;
    /// What Linux's IPoIB adds to join (and so create) any other group,
    /// its values copied from the broadcast group (RFC 4391).
    pub const IPOIB_CREATE: u64 = IPOIB_BCAST_JOIN
        | QKEY
        | MTU_SELECTOR
        | MTU
        | TRAFFIC_CLASS
        | RATE_SELECTOR
        | RATE
        | SL
        | FLOW_LABEL
        | HOP_LIMIT;
    /// What OpenSM needs to join an existing group (`JOIN_MC_COMP_MASK`).
    pub const OPENSM_JOIN: u64 = MGID | PORT_GID | JOIN_STATE;
    /// What OpenSM needs beyond [`OPENSM_JOIN`] to create a group
    /// (`REQUIRED_MC_CREATE_COMP_MASK`); without them a join of an unknown
    /// group is refused with ERR_REQ_INSUFFICIENT_COMPONENTS.
    pub const OPENSM_CREATE: u64 = OPENSM_JOIN | QKEY | TRAFFIC_CLASS | PKEY | FLOW_LABEL | SL;
}

/// JoinState bits of an MCMemberRecord (IBTA 15.2.5.17).
pub mod join_state {
    /// FullMember.
    pub const FULL_MEMBER: u8 = 1 << 0;
    /// NonMember.
    pub const NON_MEMBER: u8 = 1 << 1;
    /// SendOnlyNonMember.
    pub const SEND_ONLY_NON_MEMBER: u8 = 1 << 2;
    /// SendOnlyFullMember (IBTA 1.3).
    pub const SEND_ONLY_FULL_MEMBER: u8 = 1 << 3;
}

fn gid_at(b: &[u8], o: usize) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[o..o + 16]);
    Gid(g)
}

/// `struct ib_sa_path_rec`, host order (IBTA 15.2.5.16; 64 bytes on the
/// wire). `mtu` and `rate` hold the raw IBTA codes (`ib_mtu`, `ib_rate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathRecord {
    /// ServiceID (reserved in IBTA 1.2's PathRecord, kept as Linux does).
    pub service_id: u64,
    /// Destination GID.
    pub dgid: Gid,
    /// Source GID.
    pub sgid: Gid,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// RawTraffic.
    pub raw_traffic: bool,
    /// FlowLabel (20 bits).
    pub flow_label: u32,
    /// HopLimit.
    pub hop_limit: u8,
    /// TClass.
    pub traffic_class: u8,
    /// Reversible.
    pub reversible: bool,
    /// NumbPath (7 bits).
    pub numb_path: u8,
    /// P_Key.
    pub pkey: u16,
    /// QoSClass (12 bits).
    pub qos_class: u16,
    /// SL (4 bits).
    pub sl: u8,
    /// MtuSelector (2 bits).
    pub mtu_selector: u8,
    /// MTU (6 bits, `ib_mtu` code: 1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// RateSelector (2 bits).
    pub rate_selector: u8,
    /// Rate (6 bits, `ib_rate` code).
    pub rate: u8,
    /// PacketLifeTimeSelector (2 bits).
    pub packet_life_time_selector: u8,
    /// PacketLifeTime (6 bits, 4.096 us * 2^x).
    pub packet_life_time: u8,
    /// Preference.
    pub preference: u8,
}

/// Bytes of a PathRecord.
pub const PATH_REC_SIZE: usize = 64;

impl PathRecord {
    /// `ib_pack(path_rec_table, ...)`: the 64 wire bytes.
    pub fn pack(&self) -> [u8; PATH_REC_SIZE] {
        let mut b = [0u8; PATH_REC_SIZE];
        b[0..8].copy_from_slice(&self.service_id.to_be_bytes());
        b[8..24].copy_from_slice(&self.dgid.0);
        b[24..40].copy_from_slice(&self.sgid.0);
        b[40..42].copy_from_slice(&self.dlid.to_be_bytes());
        b[42..44].copy_from_slice(&self.slid.to_be_bytes());
        let w44 = (u32::from(self.raw_traffic) << 31)
            | ((self.flow_label & 0xf_ffff) << 8)
            | u32::from(self.hop_limit);
        b[44..48].copy_from_slice(&w44.to_be_bytes());
        let w48 = (u32::from(self.traffic_class) << 24)
            | (u32::from(self.reversible) << 23)
            | (u32::from(self.numb_path & 0x7f) << 16)
            | u32::from(self.pkey);
        b[48..52].copy_from_slice(&w48.to_be_bytes());
        let w52 = (u32::from(self.qos_class & 0xfff) << 20)
            | (u32::from(self.sl & 0xf) << 16)
            | (u32::from(self.mtu_selector & 3) << 14)
            | (u32::from(self.mtu & 0x3f) << 8)
            | (u32::from(self.rate_selector & 3) << 6)
            | u32::from(self.rate & 0x3f);
        b[52..56].copy_from_slice(&w52.to_be_bytes());
        b[56] = ((self.packet_life_time_selector & 3) << 6) | (self.packet_life_time & 0x3f);
        b[57] = self.preference;
        b
    }

    /// `ib_unpack(path_rec_table, ...)`: from at least 64 bytes.
    pub fn unpack(b: &[u8]) -> Result<PathRecord> {
        if b.len() < PATH_REC_SIZE {
            return Err(Error::Invalid("PathRecord shorter than 64 bytes"));
        }
        let w44 = get_be32(b, 44);
        let w48 = get_be32(b, 48);
        let w52 = get_be32(b, 52);
        Ok(PathRecord {
            service_id: get_be64(b, 0),
            dgid: gid_at(b, 8),
            sgid: gid_at(b, 24),
            dlid: get_be16(b, 40),
            slid: get_be16(b, 42),
            raw_traffic: w44 >> 31 != 0,
            flow_label: (w44 >> 8) & 0xf_ffff,
            hop_limit: w44 as u8,
            traffic_class: (w48 >> 24) as u8,
            reversible: (w48 >> 23) & 1 != 0,
            numb_path: ((w48 >> 16) & 0x7f) as u8,
            pkey: w48 as u16,
            qos_class: ((w52 >> 20) & 0xfff) as u16,
            sl: ((w52 >> 16) & 0xf) as u8,
            mtu_selector: ((w52 >> 14) & 3) as u8,
            mtu: ((w52 >> 8) & 0x3f) as u8,
            rate_selector: ((w52 >> 6) & 3) as u8,
            rate: (w52 & 0x3f) as u8,
            packet_life_time_selector: b[56] >> 6,
            packet_life_time: b[56] & 0x3f,
            preference: b[57],
        })
    }
}

/// The NodeInfo part of a NodeRecord (IBTA 14.2.5.3, 40 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// BaseVersion.
    pub base_version: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// NodeType (1 CA, 2 switch, 3 router).
    pub node_type: u8,
    /// NumPorts.
    pub num_ports: u8,
    /// SystemImageGUID.
    pub sys_image_guid: u64,
    /// NodeGUID.
    pub node_guid: u64,
    /// PortGUID.
    pub port_guid: u64,
    /// PartitionCap.
    pub partition_cap: u16,
    /// DeviceID.
    pub device_id: u16,
    /// Revision.
    pub revision: u32,
    /// LocalPortNum.
    pub local_port_num: u8,
    /// VendorID (24 bits).
    pub vendor_id: u32,
}

/// `struct ib_sa_node_rec` equivalent (IBTA 15.2.5.2): 108 bytes, 112 with
/// the padding to 8 bytes that the attribute offset counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// LID.
    pub lid: u16,
    /// NodeInfo.
    pub node_info: NodeInfo,
    /// NodeDescription (64 bytes, NUL padded).
    pub node_desc: [u8; 64],
}

impl Default for NodeRecord {
    fn default() -> Self {
        NodeRecord {
            lid: 0,
            node_info: NodeInfo::default(),
            node_desc: [0; 64],
        }
    }
}

/// Bytes of a NodeRecord on the wire, padded (attribute offset 14).
pub const NODE_REC_SIZE: usize = 112;

impl NodeRecord {
    /// The wire bytes.
    pub fn pack(&self) -> [u8; NODE_REC_SIZE] {
        let mut b = [0u8; NODE_REC_SIZE];
        let n = &self.node_info;
        b[0..2].copy_from_slice(&self.lid.to_be_bytes());
        b[4] = n.base_version;
        b[5] = n.class_version;
        b[6] = n.node_type;
        b[7] = n.num_ports;
        b[8..16].copy_from_slice(&n.sys_image_guid.to_be_bytes());
        b[16..24].copy_from_slice(&n.node_guid.to_be_bytes());
        b[24..32].copy_from_slice(&n.port_guid.to_be_bytes());
        b[32..34].copy_from_slice(&n.partition_cap.to_be_bytes());
        b[34..36].copy_from_slice(&n.device_id.to_be_bytes());
        b[36..40].copy_from_slice(&n.revision.to_be_bytes());
        let w = (u32::from(n.local_port_num) << 24) | (n.vendor_id & 0xff_ffff);
        b[40..44].copy_from_slice(&w.to_be_bytes());
        b[44..108].copy_from_slice(&self.node_desc);
        b
    }

    /// From at least 108 bytes.
    pub fn unpack(b: &[u8]) -> Result<NodeRecord> {
        if b.len() < 108 {
            return Err(Error::Invalid("NodeRecord shorter than 108 bytes"));
        }
        let w = get_be32(b, 40);
        let mut node_desc = [0u8; 64];
        node_desc.copy_from_slice(&b[44..108]);
        Ok(NodeRecord {
            lid: get_be16(b, 0),
            node_info: NodeInfo {
                base_version: b[4],
                class_version: b[5],
                node_type: b[6],
                num_ports: b[7],
                sys_image_guid: get_be64(b, 8),
                node_guid: get_be64(b, 16),
                port_guid: get_be64(b, 24),
                partition_cap: get_be16(b, 32),
                device_id: get_be16(b, 34),
                revision: get_be32(b, 36),
                local_port_num: (w >> 24) as u8,
                vendor_id: w & 0xff_ffff,
            },
            node_desc,
        })
    }

    /// The node description up to its first NUL (lossy for non-UTF-8).
    pub fn desc(&self) -> &str {
        let end = self.node_desc.iter().position(|&c| c == 0).unwrap_or(64);
        core::str::from_utf8(&self.node_desc[..end]).unwrap_or("<non-UTF-8 description>")
    }
}

/// A PortInfoRecord (IBTA 15.2.5.3): the port's LID and number and its
/// 64-byte PortInfo; 68 bytes, 72 with padding (attribute offset 9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfoRecord {
    /// EndportLID.
    pub lid: u16,
    /// PortNum.
    pub port_num: u8,
    /// Options (reserved in IBTA 1.2).
    pub options: u8,
    /// PortInfo in wire order (IBTA 14.2.5.6).
    pub port_info: [u8; 64],
}

impl Default for PortInfoRecord {
    fn default() -> Self {
        PortInfoRecord {
            lid: 0,
            port_num: 0,
            options: 0,
            port_info: [0; 64],
        }
    }
}

/// Bytes of a PortInfoRecord on the wire, padded.
pub const PORT_INFO_REC_SIZE: usize = 72;

impl PortInfoRecord {
    /// The wire bytes.
    pub fn pack(&self) -> [u8; PORT_INFO_REC_SIZE] {
        let mut b = [0u8; PORT_INFO_REC_SIZE];
        b[0..2].copy_from_slice(&self.lid.to_be_bytes());
        b[2] = self.port_num;
        b[3] = self.options;
        b[4..68].copy_from_slice(&self.port_info);
        b
    }
    /// From at least 68 bytes.
    pub fn unpack(b: &[u8]) -> Result<PortInfoRecord> {
        if b.len() < 68 {
            return Err(Error::Invalid("PortInfoRecord shorter than 68 bytes"));
        }
        let mut port_info = [0u8; 64];
        port_info.copy_from_slice(&b[4..68]);
        Ok(PortInfoRecord {
            lid: get_be16(b, 0),
            port_num: b[2],
            options: b[3],
            port_info,
        })
    }
    /// PortInfo.LID.
    pub fn base_lid(&self) -> u16 {
        get_be16(&self.port_info, 16)
    }
    /// PortInfo.MasterSMLID.
    pub fn sm_lid(&self) -> u16 {
        get_be16(&self.port_info, 18)
    }
    /// PortInfo.CapabilityMask.
    pub fn capability_mask(&self) -> u32 {
        get_be32(&self.port_info, 20)
    }
    /// PortInfo.PortState (1 Down ... 4 Active).
    pub fn port_state(&self) -> u8 {
        self.port_info[32] & 0xf
    }
}

/// `struct ib_sa_mcmember_rec`, host order (IBTA 15.2.5.17; 52 bytes on
/// the wire, 56 with the padding the attribute offset counts). `mtu` and
/// `rate` hold the raw IBTA codes; `scope` and `join_state` are 4 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct McMemberRecord {
    /// Multicast GID.
    pub mgid: Gid,
    /// The member port's GID.
    pub port_gid: Gid,
    /// Q_Key of the group.
    pub qkey: u32,
    /// Multicast LID.
    pub mlid: u16,
    /// MTUSelector (2 bits).
    pub mtu_selector: u8,
    /// MTU (6 bits, `ib_mtu` code).
    pub mtu: u8,
    /// TClass.
    pub traffic_class: u8,
    /// P_Key.
    pub pkey: u16,
    /// RateSelector (2 bits).
    pub rate_selector: u8,
    /// Rate (6 bits, `ib_rate` code).
    pub rate: u8,
    /// PacketLifeTimeSelector (2 bits).
    pub packet_life_time_selector: u8,
    /// PacketLifeTime (6 bits).
    pub packet_life_time: u8,
    /// SL (4 bits).
    pub sl: u8,
    /// FlowLabel (20 bits).
    pub flow_label: u32,
    /// HopLimit.
    pub hop_limit: u8,
    /// Scope (4 bits; 2 = link-local).
    pub scope: u8,
    /// JoinState (4 bits, [`join_state`]).
    pub join_state: u8,
    /// ProxyJoin.
    pub proxy_join: bool,
}

/// Bytes of an MCMemberRecord on the wire (without the padding).
pub const MC_MEMBER_REC_SIZE: usize = 52;
/// Bytes an MCMemberRecord takes in a GetTable answer (attribute offset
/// 7: padded to 8 bytes).
pub const MC_MEMBER_REC_PADDED: usize = 56;

impl McMemberRecord {
    /// `ib_pack(mcmember_rec_table, ...)`: the 52 wire bytes.
    pub fn pack(&self) -> [u8; MC_MEMBER_REC_SIZE] {
        let mut b = [0u8; MC_MEMBER_REC_SIZE];
        b[0..16].copy_from_slice(&self.mgid.0);
        b[16..32].copy_from_slice(&self.port_gid.0);
        b[32..36].copy_from_slice(&self.qkey.to_be_bytes());
        b[36..38].copy_from_slice(&self.mlid.to_be_bytes());
        b[38] = ((self.mtu_selector & 3) << 6) | (self.mtu & 0x3f);
        b[39] = self.traffic_class;
        b[40..42].copy_from_slice(&self.pkey.to_be_bytes());
        b[42] = ((self.rate_selector & 3) << 6) | (self.rate & 0x3f);
        b[43] = ((self.packet_life_time_selector & 3) << 6) | (self.packet_life_time & 0x3f);
        let w44 = (u32::from(self.sl & 0xf) << 28)
            | ((self.flow_label & 0xf_ffff) << 8)
            | u32::from(self.hop_limit);
        b[44..48].copy_from_slice(&w44.to_be_bytes());
        b[48] = ((self.scope & 0xf) << 4) | (self.join_state & 0xf);
        b[49] = u8::from(self.proxy_join) << 7;
        b
    }

    /// `ib_unpack(mcmember_rec_table, ...)`: from at least 52 bytes.
    pub fn unpack(b: &[u8]) -> Result<McMemberRecord> {
        if b.len() < MC_MEMBER_REC_SIZE {
            return Err(Error::Invalid("MCMemberRecord shorter than 52 bytes"));
        }
        let w44 = get_be32(b, 44);
        Ok(McMemberRecord {
            mgid: gid_at(b, 0),
            port_gid: gid_at(b, 16),
            qkey: get_be32(b, 32),
            mlid: get_be16(b, 36),
            mtu_selector: b[38] >> 6,
            mtu: b[38] & 0x3f,
            traffic_class: b[39],
            pkey: get_be16(b, 40),
            rate_selector: b[42] >> 6,
            rate: b[42] & 0x3f,
            packet_life_time_selector: b[43] >> 6,
            packet_life_time: b[43] & 0x3f,
            sl: (w44 >> 28) as u8,
            flow_label: (w44 >> 8) & 0xf_ffff,
            hop_limit: w44 as u8,
            scope: b[48] >> 4,
            join_state: b[48] & 0xf,
            proxy_join: b[49] & 0x80 != 0,
        })
    }

    /// The MTU byte as saquery prints it (selector in bits 7:6).
    pub fn mtu_raw(&self) -> u8 {
        ((self.mtu_selector & 3) << 6) | (self.mtu & 0x3f)
    }

    /// The rate byte as saquery prints it (selector in bits 7:6).
    pub fn rate_raw(&self) -> u8 {
        ((self.rate_selector & 3) << 6) | (self.rate & 0x3f)
    }
}

/// Builds an SA request MAD (`init_mad` + the SA header): class 0x03,
/// version 2, `method`, `attr_id`, component mask at byte 48, the record at
/// byte 56.
pub fn build_mad(method: u8, attr_id: u16, comp_mask: u64, rec: &[u8]) -> Result<Mad> {
    if rec.len() > IB_SA_DATA_SIZE {
        return Err(Error::MsgSize);
    }
    let mut m = Mad::new_request(class::SUBN_ADM, IB_SA_CLASS_VERSION, method, attr_id, 0);
    m.0[48..56].copy_from_slice(&comp_mask.to_be_bytes());
    m.0[IB_SA_DATA_OFFSET..IB_SA_DATA_OFFSET + rec.len()].copy_from_slice(rec);
    Ok(m)
}

/// The SA header's component mask.
pub fn comp_mask(m: &Mad) -> u64 {
    get_be64(&m.0, 48)
}
/// The SA header's attribute offset (in 8-byte words).
pub fn attr_offset(m: &Mad) -> u16 {
    get_be16(&m.0, 44)
}
/// Sets the SA header's attribute offset.
pub fn set_attr_offset(m: &mut Mad, words: u16) {
    m.0[44..46].copy_from_slice(&words.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::method;

    fn sample_path() -> PathRecord {
        PathRecord {
            service_id: 0x0102_0304_0506_0708,
            dgid: Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_0b01),
            sgid: Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_0a01),
            dlid: 0x0014,
            slid: 0x000a,
            raw_traffic: true,
            flow_label: 0xabcde,
            hop_limit: 0x40,
            traffic_class: 0x12,
            reversible: true,
            numb_path: 0x7f,
            pkey: 0xffff,
            qos_class: 0xabc,
            sl: 0x5,
            mtu_selector: 2,
            mtu: 4,
            rate_selector: 2,
            rate: 3,
            packet_life_time_selector: 2,
            packet_life_time: 0x12,
            preference: 0x34,
        }
    }

    #[test]
    fn path_record_golden_bytes() {
        let b = sample_path().pack();
        let mut want = [0u8; 64];
        want[0..8].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        want[8..24].copy_from_slice(&[
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xc9, 0x03, 0, 0, 0x0b, 0x01,
        ]);
        want[24..40].copy_from_slice(&[
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xc9, 0x03, 0, 0, 0x0a, 0x01,
        ]);
        want[40..44].copy_from_slice(&[0x00, 0x14, 0x00, 0x0a]);
        // RawTraffic 1 | rsvd 3 | FlowLabel 0xabcde | HopLimit 0x40
        want[44..48].copy_from_slice(&[0x8a, 0xbc, 0xde, 0x40]);
        // TClass 0x12 | Reversible 1 | NumbPath 0x7f | P_Key 0xffff
        want[48..52].copy_from_slice(&[0x12, 0xff, 0xff, 0xff]);
        // QoSClass 0xabc | SL 5 | MtuSel 2 | MTU 4 | RateSel 2 | Rate 3
        want[52..56].copy_from_slice(&[0xab, 0xc5, 0x84, 0x83]);
        // PacketLifeTimeSelector 2 | PacketLifeTime 0x12, Preference 0x34
        want[56..58].copy_from_slice(&[0x92, 0x34]);
        assert_eq!(b, want);
        assert_eq!(PathRecord::unpack(&b).unwrap(), sample_path());
    }

    #[test]
    fn path_record_fields_do_not_bleed() {
        // One field at its maximum, every other zero: only its own bits set.
        let p = PathRecord {
            sl: 0xff,
            ..PathRecord::default()
        };
        let b = p.pack();
        assert_eq!(&b[52..56], &[0x00, 0x0f, 0x00, 0x00]);
        let p = PathRecord {
            flow_label: 0xffff_ffff,
            ..PathRecord::default()
        };
        assert_eq!(&p.pack()[44..48], &[0x0f, 0xff, 0xff, 0x00]);
        assert!(PathRecord::unpack(&[0u8; 63]).is_err());
    }

    #[test]
    fn node_record_golden_bytes() {
        let mut desc = [0u8; 64];
        desc[..6].copy_from_slice(b"node a");
        let r = NodeRecord {
            lid: 0x0102,
            node_info: NodeInfo {
                base_version: 1,
                class_version: 1,
                node_type: 1,
                num_ports: 2,
                sys_image_guid: 0x1111_2222_3333_4444,
                node_guid: 0x5555_6666_7777_8888,
                port_guid: 0x9999_aaaa_bbbb_cccc,
                partition_cap: 128,
                device_id: 0x1003,
                revision: 0xa0,
                local_port_num: 1,
                vendor_id: 0x0002c9,
            },
            node_desc: desc,
        };
        let b = r.pack();
        let mut want = [0u8; 112];
        want[0..4].copy_from_slice(&[0x01, 0x02, 0, 0]);
        want[4..8].copy_from_slice(&[1, 1, 1, 2]);
        want[8..16].copy_from_slice(&[0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44]);
        want[16..24].copy_from_slice(&[0x55, 0x55, 0x66, 0x66, 0x77, 0x77, 0x88, 0x88]);
        want[24..32].copy_from_slice(&[0x99, 0x99, 0xaa, 0xaa, 0xbb, 0xbb, 0xcc, 0xcc]);
        want[32..36].copy_from_slice(&[0x00, 0x80, 0x10, 0x03]);
        want[36..40].copy_from_slice(&[0, 0, 0, 0xa0]);
        want[40..44].copy_from_slice(&[0x01, 0x00, 0x02, 0xc9]);
        want[44..50].copy_from_slice(b"node a");
        assert_eq!(b, want);
        let back = NodeRecord::unpack(&b).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.desc(), "node a");
    }

    #[test]
    fn portinfo_record_golden_bytes() {
        let mut pi = [0u8; 64];
        pi[16..18].copy_from_slice(&0x0014u16.to_be_bytes());
        pi[18..20].copy_from_slice(&0x0001u16.to_be_bytes());
        pi[20..24].copy_from_slice(&0x0251_0868u32.to_be_bytes());
        pi[32] = 0x54;
        let r = PortInfoRecord {
            lid: 0x0014,
            port_num: 1,
            options: 0,
            port_info: pi,
        };
        let b = r.pack();
        assert_eq!(&b[0..4], &[0x00, 0x14, 0x01, 0x00]);
        assert_eq!(&b[4 + 16..4 + 24], &[0, 0x14, 0, 1, 0x02, 0x51, 0x08, 0x68]);
        assert_eq!(b[4 + 32], 0x54);
        assert_eq!(&b[68..72], &[0; 4]);
        let back = PortInfoRecord::unpack(&b).unwrap();
        assert_eq!(back.base_lid(), 0x14);
        assert_eq!(back.sm_lid(), 1);
        assert_eq!(back.capability_mask(), 0x0251_0868);
        assert_eq!(back.port_state(), 4);
    }

    /// The IPv4 broadcast group OpenSM makes without a partitions.conf,
    /// as a member's join answer carries it.
    pub(crate) fn ipv4_bcast_rec() -> McMemberRecord {
        let mut mgid = [0u8; 16];
        mgid[..6].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b, 0xff, 0xff]);
        mgid[12..].copy_from_slice(&[0xff; 4]);
        McMemberRecord {
            mgid: Gid(mgid),
            port_gid: Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_0a01),
            qkey: 0x0b1b,
            mlid: 0xc001,
            mtu_selector: 2,
            mtu: 4,
            traffic_class: 0,
            pkey: 0xffff,
            rate_selector: 2,
            rate: 3,
            packet_life_time_selector: 2,
            packet_life_time: 0x12,
            sl: 0,
            flow_label: 0,
            hop_limit: 0,
            scope: 2,
            join_state: join_state::FULL_MEMBER,
            proxy_join: false,
        }
    }

    #[test]
    fn mcmember_record_golden_bytes() {
        let r = ipv4_bcast_rec();
        let b = r.pack();
        let mut want = [0u8; 52];
        want[0..16].copy_from_slice(&[
            0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
        ]);
        want[16..32].copy_from_slice(&[
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xc9, 0x03, 0, 0, 0x0a, 0x01,
        ]);
        // Q_Key, MLID, MTUSel|MTU 0x84, TClass, P_Key, RateSel|Rate 0x83,
        // PLTSel|PLT 0x92.
        want[32..44].copy_from_slice(&[
            0, 0, 0x0b, 0x1b, 0xc0, 0x01, 0x84, 0, 0xff, 0xff, 0x83, 0x92,
        ]);
        // SL 0 | FlowLabel 0 | HopLimit 0; Scope 2 | JoinState 1.
        want[48] = 0x21;
        assert_eq!(b, want);
        assert_eq!(McMemberRecord::unpack(&b).unwrap(), r);
        assert_eq!((r.mtu_raw(), r.rate_raw()), (0x84, 0x83));
        // SL, flow label and hop limit share a word; the proxy-join bit is
        // the top of byte 49.
        let r = McMemberRecord {
            sl: 0xf,
            flow_label: 0xabcde,
            hop_limit: 0x40,
            proxy_join: true,
            scope: 0xe,
            join_state: join_state::SEND_ONLY_FULL_MEMBER,
            ..McMemberRecord::default()
        };
        let b = r.pack();
        assert_eq!(&b[44..52], &[0xfa, 0xbc, 0xde, 0x40, 0xe8, 0x80, 0, 0]);
        assert_eq!(McMemberRecord::unpack(&b).unwrap(), r);
        // Fields past their width do not bleed into their neighbours.
        let r = McMemberRecord {
            sl: 0xff,
            flow_label: u32::MAX,
            mtu: 0xff,
            rate: 0xff,
            join_state: 0xff,
            ..McMemberRecord::default()
        };
        let b = r.pack();
        assert_eq!(
            &b[38..50],
            &[0x3f, 0, 0, 0, 0x3f, 0, 0xff, 0xff, 0xff, 0, 0x0f, 0]
        );
        assert!(McMemberRecord::unpack(&[0u8; 51]).is_err());
        // The component masks, as Linux and OpenSM number them.
        assert_eq!(mcmember_comp::JOIN_STATE, 0x1_0000);
        assert_eq!(mcmember_comp::IPOIB_BCAST_JOIN, 0x1_0083);
        assert_eq!(mcmember_comp::OPENSM_JOIN, 0x1_0003);
        assert_eq!(mcmember_comp::OPENSM_CREATE, 0x1_30c7);
        assert_eq!(mcmember_comp::IPOIB_CREATE, 0x1_73f7);
        assert_eq!(sa_attr::MC_MEMBER_REC, 0x38);
    }

    #[test]
    fn sa_status_names() {
        assert_eq!(sa_status_str(0), None);
        assert_eq!(sa_status_str(crate::mad::status::BUSY), Some("busy"));
        assert!(
            sa_status_str(0x0600)
                .unwrap()
                .contains("INSUFFICIENT_COMPONENTS")
        );
        assert!(sa_status_str(0x0200).unwrap().contains("ERR_REQ_INVALID"));
        assert_eq!(sa_status_str(0x7f00), None);
    }

    #[test]
    fn sa_mad_header_golden_bytes() {
        let m = build_mad(
            method::GET,
            sa_attr::PATH_REC,
            path_comp::DLID | path_comp::SLID,
            &[0xaa; 64],
        )
        .unwrap();
        assert_eq!(&m.0[0..4], &[1, 0x03, 2, 0x01]);
        assert_eq!(&m.0[16..18], &[0x00, 0x35]);
        assert_eq!(&m.0[48..56], &[0, 0, 0, 0, 0, 0, 0, 0x30]);
        assert_eq!(m.0[56], 0xaa);
        assert_eq!(m.0[119], 0xaa);
        assert_eq!(m.0[120], 0);
        assert!(build_mad(method::GET, 1, 0, &[0; 201]).is_err());
        // Component mask constants, as OpenSM and Linux number them.
        assert_eq!(path_comp::DGID, 0x4);
        assert_eq!(path_comp::PKEY, 0x2000);
        assert_eq!(path_comp::PREFERENCE, 0x40_0000);
        assert_eq!(node_comp::NODE_DESC, 0x4000);
        assert_eq!(portinfo_comp::PORT_NUM, 0x2);
    }
}
