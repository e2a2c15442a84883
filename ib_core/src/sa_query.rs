//! Port of Linux `drivers/infiniband/core/sa_query.c` (3.11, absent in LegoOS), busy-polled: PathRecord, NodeRecord and PortInfoRecord queries (SubnAdmGet and SubnAdmGetTable) sent on QP1 to the SM's LID and SL (`update_sm_ah`), with retries and backoff while the SA does not answer, and a per-port PathRecord cache dropped on LID change, SM change and client re-register; ServiceRecord, MCMemberRecord (`multicast.c`), InformInfo/notices, SA redirection and sending RMPP are left out (a GetTable answer spanning several MADs is taken through the MAD layer's RMPP reassembly).
//!
//! The SA client is an [`IbClient`] whose per-device state lives in the
//! device's client data (as Linux's `ib_sa_device`); it is driven by
//! [`IbClient::poll`] from [`IbCore::poll`], so a blocking helper here only
//! waits on [`IbCore::poll_until`] against its deadline.
//!
//! Layouts: IBTA Vol. 1 15.2.5 (PathRecord 15.2.5.16, NodeRecord 15.2.5.2,
//! PortInfoRecord 15.2.5.3), checked against Linux's `path_rec_table` and
//! OpenSM's `ib_types.h` as facts.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::time::Duration;

use crate::device::{ClientId, Device, DeviceId, IbClient, IbCore};
use crate::error::{Error, Result};
use crate::mad::{Mad, MadAgent, MadEvent, MadSendBuf, MadSendId, class, method};
use crate::verbs::{
    AhAttr, Event, EventElement, EventType, Gid, GlobalRoute, IB_QP1_QKEY, PortState, QpType,
};

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
}

/// SA methods beyond the common ones (`IB_SA_METHOD_*`).
pub mod sa_method {
    /// GetTable.
    pub const GET_TABLE: u8 = 0x12;
    /// GetTableResp.
    pub const GET_TABLE_RESP: u8 = 0x92;
    /// Delete.
    pub const DELETE: u8 = 0x15;
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

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn be64(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(x)
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
        let w44 = be32(b, 44);
        let w48 = be32(b, 48);
        let w52 = be32(b, 52);
        Ok(PathRecord {
            service_id: be64(b, 0),
            dgid: gid_at(b, 8),
            sgid: gid_at(b, 24),
            dlid: be16(b, 40),
            slid: be16(b, 42),
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
        let w = be32(b, 40);
        let mut node_desc = [0u8; 64];
        node_desc.copy_from_slice(&b[44..108]);
        Ok(NodeRecord {
            lid: be16(b, 0),
            node_info: NodeInfo {
                base_version: b[4],
                class_version: b[5],
                node_type: b[6],
                num_ports: b[7],
                sys_image_guid: be64(b, 8),
                node_guid: be64(b, 16),
                port_guid: be64(b, 24),
                partition_cap: be16(b, 32),
                device_id: be16(b, 34),
                revision: be32(b, 36),
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
            lid: be16(b, 0),
            port_num: b[2],
            options: b[3],
            port_info,
        })
    }
    /// PortInfo.LID.
    pub fn base_lid(&self) -> u16 {
        be16(&self.port_info, 16)
    }
    /// PortInfo.MasterSMLID.
    pub fn sm_lid(&self) -> u16 {
        be16(&self.port_info, 18)
    }
    /// PortInfo.CapabilityMask.
    pub fn capability_mask(&self) -> u32 {
        be32(&self.port_info, 20)
    }
    /// PortInfo.PortState (1 Down ... 4 Active).
    pub fn port_state(&self) -> u8 {
        self.port_info[32] & 0xf
    }
}

/// Builds an SA request MAD (`init_mad` + the SA header): class 0x03,
/// version 2, `method`, `attr_id`, component mask at byte 48, the record at
/// byte 56.
pub fn ib_sa_build_mad(method: u8, attr_id: u16, comp_mask: u64, rec: &[u8]) -> Result<Mad> {
    if rec.len() > IB_SA_DATA_SIZE {
        return Err(Error::MsgSize);
    }
    let mut m = Mad::new_request(class::SUBN_ADM, IB_SA_CLASS_VERSION, method, attr_id, 0);
    m.0[48..56].copy_from_slice(&comp_mask.to_be_bytes());
    m.0[IB_SA_DATA_OFFSET..IB_SA_DATA_OFFSET + rec.len()].copy_from_slice(rec);
    Ok(m)
}

/// The SA header's component mask.
pub fn sa_comp_mask(m: &Mad) -> u64 {
    be64(&m.0, 48)
}
/// The SA header's attribute offset (in 8-byte words).
pub fn sa_attr_offset(m: &Mad) -> u16 {
    be16(&m.0, 44)
}
/// Sets the SA header's attribute offset.
pub fn sa_set_attr_offset(m: &mut Mad, words: u16) {
    m.0[44..46].copy_from_slice(&words.to_be_bytes());
}

/// Records of a response: `(first segment, reassembled data)` to one record
/// slice each. A Get answer holds one record; a GetTable answer as many as
/// the attribute offset divides the payload into (the RMPP payload length
/// of a single-MAD answer, or the reassembled data of a multi-MAD one).
fn response_records(mad: &Mad, rmpp_data: Option<&[u8]>, min_len: usize) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    if mad.method() == method::GET_RESP {
        out.push(mad.0[IB_SA_DATA_OFFSET..].to_vec());
        return Ok(out);
    }
    if mad.method() != sa_method::GET_TABLE_RESP {
        return Err(Error::Invalid("SA response with an unexpected method"));
    }
    let stride = usize::from(sa_attr_offset(mad)) * 8;
    let data: &[u8] = match rmpp_data {
        Some(d) => d,
        None => {
            // Single MAD: RMPP header active (OpenSM) gives the payload
            // length (SA header 20 bytes + records); without it, one MAD's
            // worth of data.
            let active = mad.0[26] & 1 != 0;
            let len = if active {
                (be32(&mad.0, 32) as usize).saturating_sub(20)
            } else {
                IB_SA_DATA_SIZE
            };
            &mad.0[IB_SA_DATA_OFFSET..IB_SA_DATA_OFFSET + len.min(IB_SA_DATA_SIZE)]
        }
    };
    if stride == 0 {
        return Ok(out); // no records
    }
    if stride < min_len {
        return Err(Error::Invalid(
            "SA attribute offset shorter than the record",
        ));
    }
    for chunk in data.chunks(stride) {
        if chunk.len() < min_len {
            break;
        }
        out.push(chunk.to_vec());
    }
    Ok(out)
}

/// For the fuzz test: `m` as the answer to a query of `attr_id` (a cached
/// PathRecord query when it is one), through the client's response handler
/// and its bookkeeping. Returns what the query ended with (None: retried).
#[cfg(test)]
pub(crate) fn sa_query_parse_for_fuzz(
    m: &Mad,
    rmpp: Option<&[u8]>,
    attr_id: u16,
) -> Option<Result<SaResponse>> {
    let min_len = match attr_id {
        sa_attr::NODE_REC => 108,
        sa_attr::PORT_INFO_REC => 68,
        _ => PATH_REC_SIZE,
    };
    let mut sp = SaPort {
        port: 1,
        agent: None,
        sm_ah: None,
        queries: Vec::new(),
        done: Vec::new(),
        next_seq: 2,
        cache: Vec::new(),
        counters: SaCounters::default(),
    };
    sp.queries.push(SaQuery {
        seq: 1,
        mad: Mad::default(),
        attr_id,
        min_len,
        deadline_ns: u64::MAX,
        try_ms: 1,
        backoff_ms: 1,
        tries: 1,
        state: QState::Backoff(0),
        cache_key: (attr_id == sa_attr::PATH_REC).then_some(PathKey::Lid(1)),
    });
    let r = handle_response(&mut sp, 0, m, rmpp)?;
    finish(&mut sp, 0, r);
    let (_, r) = sp.done.pop()?;
    Some(r)
}

// ---------------------------------------------------------------------------
// The client

/// One query, as the caller names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SaQueryId {
    /// Device.
    pub dev: DeviceId,
    /// Port.
    pub port: u8,
    /// Sequence number on that port.
    pub seq: u64,
}

/// A finished query's answer: the records in wire order (each as long as
/// the attribute offset says, at least the record's size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaResponse {
    /// Attribute queried.
    pub attr_id: u16,
    /// The records.
    pub records: Vec<Vec<u8>>,
    /// Tries it took (1 = answered at once).
    pub tries: u32,
}

impl SaResponse {
    /// The records as PathRecords.
    pub fn path_records(&self) -> Result<Vec<PathRecord>> {
        self.records.iter().map(|r| PathRecord::unpack(r)).collect()
    }
    /// The records as NodeRecords.
    pub fn node_records(&self) -> Result<Vec<NodeRecord>> {
        self.records.iter().map(|r| NodeRecord::unpack(r)).collect()
    }
    /// The records as PortInfoRecords.
    pub fn portinfo_records(&self) -> Result<Vec<PortInfoRecord>> {
        self.records
            .iter()
            .map(|r| PortInfoRecord::unpack(r))
            .collect()
    }
}

/// Retry policy of the SA client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaRetry {
    /// Response timeout of the first try.
    pub first_try_ms: u32,
    /// The per-try timeout doubles up to this.
    pub max_try_ms: u32,
    /// Wait before re-sending after a BUSY answer or while the port has no
    /// SM; doubles up to `max_try_ms` too.
    pub backoff_ms: u32,
}

impl Default for SaRetry {
    fn default() -> Self {
        SaRetry {
            first_try_ms: 100,
            max_try_ms: 1600,
            backoff_ms: 50,
        }
    }
}

/// What the SA client of one port counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SaCounters {
    /// Requests sent (retries included).
    pub sent: u64,
    /// Retries after a timeout or a BUSY answer.
    pub retries: u64,
    /// Queries answered with records.
    pub answered: u64,
    /// Queries that ran out of time.
    pub timeouts: u64,
    /// Answers with a non-zero status (BUSY aside).
    pub errors: u64,
    /// PathRecord cache hits.
    pub cache_hits: u64,
    /// Times the PathRecord cache was dropped by an event.
    pub cache_flushes: u64,
    /// Answers that could not be parsed.
    pub bad_answers: u64,
}

/// The address of the SA (Linux's `ib_sa_sm_ah`): SM LID, SM SL and the
/// P_Key index of the default P_Key, as `update_sm_ah` reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmAh {
    /// SM LID.
    pub dlid: u16,
    /// SM SL.
    pub sl: u8,
    /// P_Key index of 0xffff (0 if the table has none).
    pub pkey_index: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QState {
    /// Waiting to (re)send at this time.
    Backoff(u64),
    /// On the wire, waiting for its answer.
    Sent(MadSendId),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PathKey {
    Gid(Gid),
    Lid(u16),
}

struct SaQuery {
    seq: u64,
    mad: Mad,
    attr_id: u16,
    min_len: usize,
    deadline_ns: u64,
    try_ms: u32,
    backoff_ms: u32,
    tries: u32,
    state: QState,
    cache_key: Option<PathKey>,
}

struct SaPort {
    port: u8,
    agent: Option<MadAgent>,
    sm_ah: Option<SmAh>,
    queries: Vec<SaQuery>,
    done: Vec<(u64, Result<SaResponse>)>,
    next_seq: u64,
    cache: Vec<(PathKey, PathRecord)>,
    counters: SaCounters,
}

/// Per-device SA state (`struct ib_sa_device`), kept in the device's client
/// data.
pub struct SaDevice {
    ports: Vec<SaPort>,
    retry: SaRetry,
}

struct SaSlot(Option<SaDevice>);

/// Finished answers kept per port until collected.
const MAX_DONE: usize = 256;
/// Queries running per port; more are refused with `-EAGAIN`.
const MAX_RUNNING: usize = 256;
/// PathRecords cached per port.
const MAX_CACHE: usize = 64;

/// The SA client (`sa_client` / `ib_sa_add_one`, `ib_sa_remove_one`,
/// `ib_sa_event`).
pub struct SaClient {
    retry: SaRetry,
}

/// `ib_sa_init`: registers the SA client with the core and returns its id,
/// the handle every query names. There is one SA client per core, as
/// Linux's `ib_sa` module is one per system: a later call returns the
/// client already registered, so every user (perftest, the diags, the
/// remote-memory service) shares its agents, its SM address and its path
/// cache instead of asking the SA again for what another user learned.
pub fn ib_sa_init(core: &mut IbCore) -> ClientId {
    ib_sa_init_with(core, SaRetry::default())
}

/// [`ib_sa_init`] with another retry policy; the policy is the first
/// registration's when the client already exists.
pub fn ib_sa_init_with(core: &mut IbCore, retry: SaRetry) -> ClientId {
    let client = SaClient { retry };
    if let Some(id) = core.client_by_name(client.name()) {
        return id;
    }
    core.ib_register_client(Box::new(client))
}

impl IbClient for SaClient {
    fn name(&self) -> &str {
        "sa"
    }
    fn accepts(&self, _n: crate::verbs::NodeType, t: crate::verbs::Transport) -> bool {
        t == crate::verbs::Transport::Ib
    }
    fn add(&mut self, me: ClientId, dev: &mut Device) {
        let ports = (1..=dev.phys_port_cnt())
            .map(|port| SaPort {
                port,
                agent: None,
                sm_ah: None,
                queries: Vec::new(),
                done: Vec::new(),
                next_seq: 1,
                cache: Vec::new(),
                counters: SaCounters::default(),
            })
            .collect();
        dev.set_client_data(
            me,
            Box::new(SaSlot(Some(SaDevice {
                ports,
                retry: self.retry,
            }))),
        );
    }
    fn remove(&mut self, _me: ClientId, _dev: &mut Device) {
        // The MAD agents go with the device's MAD ports.
    }
    fn event(&mut self, me: ClientId, dev: &mut Device, event: &Event) {
        let EventElement::Port(p) = event.element else {
            return;
        };
        let Some(SaSlot(Some(sd))) = dev.client_data::<SaSlot>(me) else {
            return;
        };
        ib_sa_event(sd, p, event.event);
    }
    fn poll(&mut self, me: ClientId, core: &mut IbCore) -> usize {
        let mut work = 0;
        // By index: the progress function allocates nothing here.
        for i in 0..core.devices.len() {
            let dev = DeviceId(i as u32);
            if core.devices[i].is_none() {
                continue;
            }
            work +=
                with_sa(core, me, dev, |core, sd| Ok(sa_poll_device(core, dev, sd))).unwrap_or(0);
        }
        work
    }
}

/// `ib_sa_event`: the SM's address is read again on the next send; the
/// PathRecord cache goes on LID change, SM change, client re-register and
/// port state changes.
fn ib_sa_event(sd: &mut SaDevice, port: u8, ev: EventType) {
    let Some(sp) = sd.ports.iter_mut().find(|p| p.port == port) else {
        return;
    };
    match ev {
        EventType::PortActive
        | EventType::PortErr
        | EventType::LidChange
        | EventType::SmChange
        | EventType::ClientReregister => {
            sp.sm_ah = None;
            if !sp.cache.is_empty() {
                sp.counters.cache_flushes += 1;
            }
            sp.cache.clear();
        }
        EventType::PkeyChange => sp.sm_ah = None,
        _ => {}
    }
}

fn with_sa<T>(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    f: impl FnOnce(&mut IbCore, &mut SaDevice) -> Result<T>,
) -> Result<T> {
    let d = core.device_mut(dev).ok_or(Error::NoDev)?;
    let slot = d.client_data::<SaSlot>(sa).ok_or(Error::NoDev)?;
    let mut sd = slot.0.take().ok_or(Error::Busy)?;
    let r = f(core, &mut sd);
    if let Some(d) = core.device_mut(dev)
        && let Some(slot) = d.client_data::<SaSlot>(sa)
    {
        slot.0 = Some(sd);
    }
    r
}

fn port_of(sd: &mut SaDevice, port: u8) -> Result<&mut SaPort> {
    sd.ports
        .iter_mut()
        .find(|p| p.port == port)
        .ok_or(Error::Invalid("port number out of range"))
}

/// `update_sm_ah`: the SA's address from the port cache (None while the
/// port is not Active or knows no SM).
fn update_sm_ah(dev: &Device, port: u8) -> Option<SmAh> {
    let c = dev.port_cache(port).ok()?;
    if c.state != Some(PortState::Active) || c.sm_lid == 0 {
        return None;
    }
    Some(SmAh {
        dlid: c.sm_lid,
        sl: c.sm_sl,
        pkey_index: c.find_pkey(0xffff).unwrap_or(0),
    })
}

fn now_ns(core: &IbCore) -> u64 {
    core.clock().now_ns()
}

fn ensure_agent(core: &mut IbCore, dev: DeviceId, sp: &mut SaPort) -> Result<MadAgent> {
    if let Some(a) = sp.agent {
        return Ok(a);
    }
    let a = core.ib_register_mad_agent(
        dev,
        sp.port,
        QpType::Gsi,
        None,
        crate::mad_rmpp::IB_MGMT_RMPP_VERSION,
    )?;
    sp.agent = Some(a);
    Ok(a)
}

/// Sends (or re-sends) query `qi`; `Ok(false)` if the port has no SM yet
/// (the query stays in backoff).
fn send_query(core: &mut IbCore, dev: DeviceId, sp: &mut SaPort, qi: usize) -> Result<bool> {
    let agent = ensure_agent(core, dev, sp)?;
    if sp.sm_ah.is_none() {
        sp.sm_ah = core.device(dev).and_then(|d| update_sm_ah(d, sp.port));
    }
    let Some(ah) = sp.sm_ah else {
        return Ok(false);
    };
    let now = now_ns(core);
    let q = &mut sp.queries[qi];
    let left_ms = q.deadline_ns.saturating_sub(now) / 1_000_000;
    let try_ms = u64::from(q.try_ms).min(left_ms).max(1) as u32;
    let mut buf = MadSendBuf::new(
        q.mad.clone(),
        AhAttr {
            dlid: ah.dlid,
            sl: ah.sl,
            port_num: sp.port,
            ..AhAttr::default()
        },
        1,
    );
    buf.remote_qkey = IB_QP1_QKEY;
    buf.pkey_index = ah.pkey_index;
    buf.timeout_ms = try_ms;
    buf.retries = 0;
    buf.context = q.seq;
    // A fresh TID per try: the core fills the low half when it is 0.
    buf.mad.set_tid(0);
    let id = core.ib_post_send_mad(agent, buf)?;
    q.tries += 1;
    q.state = QState::Sent(id);
    sp.counters.sent += 1;
    Ok(true)
}

fn finish(sp: &mut SaPort, qi: usize, r: Result<SaResponse>) {
    let q = sp.queries.swap_remove(qi);
    match &r {
        Ok(resp) => {
            sp.counters.answered += 1;
            if let (Some(key), Some(rec)) = (q.cache_key, resp.records.first())
                && let Ok(p) = PathRecord::unpack(rec)
            {
                sp.cache.retain(|(k, _)| *k != key);
                if sp.cache.len() >= MAX_CACHE {
                    sp.cache.remove(0);
                }
                sp.cache.push((key, p));
            }
        }
        Err(Error::TimedOut) => sp.counters.timeouts += 1,
        Err(_) => sp.counters.errors += 1,
    }
    if sp.done.len() >= MAX_DONE {
        let _ = sp.done.remove(0);
    }
    sp.done.push((q.seq, r));
}

/// Schedules a retry of `qi` after its backoff, or ends it with
/// `-ETIMEDOUT` when the deadline does not leave room for one.
fn retry_later(core: &IbCore, sp: &mut SaPort, qi: usize, max_ms: u32) {
    let now = now_ns(core);
    let q = &mut sp.queries[qi];
    if now >= q.deadline_ns {
        finish(sp, qi, Err(Error::TimedOut));
        return;
    }
    // The last try may be short; the query ends at its deadline.
    let at = now
        .saturating_add(u64::from(q.backoff_ms) * 1_000_000)
        .min(q.deadline_ns);
    q.backoff_ms = q.backoff_ms.saturating_mul(2).min(max_ms);
    q.try_ms = q.try_ms.saturating_mul(2).min(max_ms);
    q.state = QState::Backoff(at);
    sp.counters.retries += 1;
}

fn handle_response(
    sp: &mut SaPort,
    qi: usize,
    mad: &Mad,
    rmpp: Option<&[u8]>,
) -> Option<Result<SaResponse>> {
    let q = &sp.queries[qi];
    let st = mad.status();
    if st == crate::mad::status::BUSY {
        return None; // retried by the caller
    }
    if st != 0 {
        let sa_code = (st >> 8) & 0x7f;
        if sa_code == sa_status::NO_RECORDS {
            return Some(Err(Error::NotFound));
        }
        return Some(Err(Error::MadStatus(st)));
    }
    if mad.attr_id() != q.attr_id {
        sp.counters.bad_answers += 1;
        return Some(Err(Error::Invalid("SA answered another attribute")));
    }
    match response_records(mad, rmpp, q.min_len) {
        Ok(records) => {
            if records.is_empty() {
                return Some(Err(Error::NotFound));
            }
            Some(Ok(SaResponse {
                attr_id: q.attr_id,
                records,
                tries: q.tries,
            }))
        }
        Err(e) => {
            sp.counters.bad_answers += 1;
            Some(Err(e))
        }
    }
}

fn sa_poll_device(core: &mut IbCore, dev: DeviceId, sd: &mut SaDevice) -> usize {
    let retry = sd.retry;
    let mut work = 0;
    for sp in sd.ports.iter_mut() {
        // Answers and send completions.
        if let Some(agent) = sp.agent {
            while let Some(ev) = core.ib_mad_poll_agent(agent) {
                work += 1;
                match ev {
                    MadEvent::Recv(r) => {
                        let Some(id) = r.send_id else { continue };
                        let Some(qi) = sp.queries.iter().position(|q| q.state == QState::Sent(id))
                        else {
                            continue;
                        };
                        match handle_response(sp, qi, &r.mad, r.rmpp_data.as_deref()) {
                            Some(res) => finish(sp, qi, res),
                            None => retry_later(core, sp, qi, retry.max_try_ms),
                        }
                    }
                    MadEvent::SendDone(s) => {
                        let Some(qi) = sp
                            .queries
                            .iter()
                            .position(|q| q.state == QState::Sent(s.id))
                        else {
                            continue;
                        };
                        // Done without an answer: timed out or failed.
                        retry_later(core, sp, qi, retry.max_try_ms);
                    }
                }
            }
        }
        // Backoffs that are over, and queries past their deadline.
        let now = now_ns(core);
        let mut qi = 0;
        while qi < sp.queries.len() {
            let q = &sp.queries[qi];
            match q.state {
                QState::Backoff(at) if now >= at => {
                    work += 1;
                    if now >= q.deadline_ns {
                        finish(sp, qi, Err(Error::TimedOut));
                        continue;
                    }
                    match send_query(core, dev, sp, qi) {
                        Ok(true) => {}
                        Ok(false) => retry_later(core, sp, qi, retry.max_try_ms),
                        Err(e) => {
                            finish(sp, qi, Err(e));
                            continue;
                        }
                    }
                }
                QState::Sent(id)
                    if now
                        >= q.deadline_ns
                            .saturating_add(u64::from(retry.max_try_ms) * 2_000_000) =>
                {
                    // The MAD layer owes us a completion; do not wait forever.
                    if let Some(a) = sp.agent {
                        let _ = core.ib_cancel_mad(a, id);
                    }
                    finish(sp, qi, Err(Error::TimedOut));
                    continue;
                }
                _ => {}
            }
            qi += 1;
        }
    }
    work
}

#[allow(clippy::too_many_arguments)]
fn start_query(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    method: u8,
    attr_id: u16,
    comp_mask: u64,
    rec: &[u8],
    min_len: usize,
    timeout: Duration,
    cache_key: Option<PathKey>,
) -> Result<SaQueryId> {
    let mut mad = ib_sa_build_mad(method, attr_id, comp_mask, rec)?;
    if method == sa_method::GET_TABLE {
        sa_set_attr_offset(&mut mad, (min_len.div_ceil(8)) as u16);
    }
    with_sa(core, sa, dev, |core, sd| {
        let retry = sd.retry;
        let sp = port_of(sd, port)?;
        if sp.queries.len() >= MAX_RUNNING {
            return Err(Error::Again);
        }
        let now = now_ns(core);
        let seq = sp.next_seq;
        sp.next_seq += 1;
        sp.queries.push(SaQuery {
            seq,
            mad,
            attr_id,
            min_len,
            deadline_ns: now.saturating_add(timeout.as_nanos().min(u128::from(u64::MAX)) as u64),
            try_ms: retry.first_try_ms.max(1),
            backoff_ms: retry.backoff_ms.max(1),
            tries: 0,
            state: QState::Backoff(now),
            cache_key,
        });
        let qi = sp.queries.len() - 1;
        match send_query(core, dev, sp, qi) {
            Ok(true) => {}
            Ok(false) => retry_later(core, sp, qi, retry.max_try_ms),
            Err(e) => {
                sp.queries.swap_remove(qi);
                return Err(e);
            }
        }
        Ok(SaQueryId { dev, port, seq })
    })
}

/// `ib_sa_path_rec_get`: starts a PathRecord Get with `comp_mask` naming
/// the fields of `rec` that matter; the answer is collected with
/// [`ib_sa_query_result`]. The query is retried with backoff until
/// `timeout` has passed, then ends with `-ETIMEDOUT`.
pub fn ib_sa_path_rec_get(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    rec: &PathRecord,
    comp_mask: u64,
    timeout: Duration,
) -> Result<SaQueryId> {
    start_query(
        core,
        sa,
        dev,
        port,
        method::GET,
        sa_attr::PATH_REC,
        comp_mask,
        &rec.pack(),
        PATH_REC_SIZE,
        timeout,
        None,
    )
}

/// NodeRecord query: Get (`table` false) or GetTable.
#[allow(clippy::too_many_arguments)]
pub fn ib_sa_node_rec_get(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    rec: &NodeRecord,
    comp_mask: u64,
    table: bool,
    timeout: Duration,
) -> Result<SaQueryId> {
    let m = if table {
        sa_method::GET_TABLE
    } else {
        method::GET
    };
    start_query(
        core,
        sa,
        dev,
        port,
        m,
        sa_attr::NODE_REC,
        comp_mask,
        &rec.pack()[..108],
        108,
        timeout,
        None,
    )
}

/// PortInfoRecord query: Get (`table` false) or GetTable.
#[allow(clippy::too_many_arguments)]
pub fn ib_sa_portinfo_rec_get(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    rec: &PortInfoRecord,
    comp_mask: u64,
    table: bool,
    timeout: Duration,
) -> Result<SaQueryId> {
    let m = if table {
        sa_method::GET_TABLE
    } else {
        method::GET
    };
    start_query(
        core,
        sa,
        dev,
        port,
        m,
        sa_attr::PORT_INFO_REC,
        comp_mask,
        &rec.pack()[..68],
        68,
        timeout,
        None,
    )
}

/// The answer of a finished query (taken: a second call says `None`);
/// `None` while it runs.
pub fn ib_sa_query_result(
    core: &mut IbCore,
    sa: ClientId,
    id: SaQueryId,
) -> Option<Result<SaResponse>> {
    with_sa(core, sa, id.dev, |_, sd| {
        let sp = port_of(sd, id.port)?;
        let i = sp.done.iter().position(|(s, _)| *s == id.seq);
        Ok(i.map(|i| sp.done.remove(i).1))
    })
    .ok()
    .flatten()
}

/// `ib_sa_cancel_query`: forgets a running query (its MAD is canceled).
pub fn ib_sa_cancel_query(core: &mut IbCore, sa: ClientId, id: SaQueryId) -> Result<()> {
    with_sa(core, sa, id.dev, |core, sd| {
        let sp = port_of(sd, id.port)?;
        let qi = sp
            .queries
            .iter()
            .position(|q| q.seq == id.seq)
            .ok_or(Error::NotFound)?;
        let q = sp.queries.swap_remove(qi);
        if let (QState::Sent(mid), Some(a)) = (q.state, sp.agent) {
            let _ = core.ib_cancel_mad(a, mid);
        }
        Ok(())
    })
}

/// Waits (polling the core) for a query's answer until `timeout` (plus a
/// little slack: the query has its own deadline and ends itself).
pub fn ib_sa_wait(
    core: &mut IbCore,
    sa: ClientId,
    id: SaQueryId,
    timeout: Duration,
) -> Result<SaResponse> {
    let r = core.poll_until(timeout + Duration::from_millis(100), |core| {
        if core.device(id.dev).is_none() {
            return Some(Err(Error::NoDev));
        }
        ib_sa_query_result(core, sa, id)
    });
    match r {
        Ok(x) => x,
        Err(e) => {
            let _ = ib_sa_cancel_query(core, sa, id);
            Err(e)
        }
    }
}

/// The port's SGID (GID index 0) and LID, for a query's source fields.
fn source_of(core: &IbCore, dev: DeviceId, port: u8) -> Result<(Gid, u16)> {
    let d = core.device(dev).ok_or(Error::NoDev)?;
    let c = d.port_cache(port)?;
    Ok((c.get_gid(0)?, c.lid))
}

fn cached_path(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    key: &PathKey,
) -> Option<PathRecord> {
    with_sa(core, sa, dev, |_, sd| {
        let sp = port_of(sd, port)?;
        let hit = sp.cache.iter().find(|(k, _)| k == key).map(|(_, p)| *p);
        if hit.is_some() {
            sp.counters.cache_hits += 1;
        }
        Ok(hit)
    })
    .ok()
    .flatten()
}

#[allow(clippy::too_many_arguments)]
fn path_wait(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    rec: PathRecord,
    comp_mask: u64,
    key: PathKey,
    timeout: Duration,
) -> Result<PathRecord> {
    if let Some(p) = cached_path(core, sa, dev, port, &key) {
        return Ok(p);
    }
    let id = start_query(
        core,
        sa,
        dev,
        port,
        method::GET,
        sa_attr::PATH_REC,
        comp_mask,
        &rec.pack(),
        PATH_REC_SIZE,
        timeout,
        Some(key),
    )?;
    let resp = ib_sa_wait(core, sa, id, timeout)?;
    resp.path_records()?
        .into_iter()
        .next()
        .ok_or(Error::NotFound)
}

/// A path from this port to `dlid` (SGID and SLID from the port cache,
/// P_Key 0xffff, one path), from the cache or the SA, within `timeout`.
pub fn sa_path_to_lid(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    dlid: u16,
    timeout: Duration,
) -> Result<PathRecord> {
    let (sgid, slid) = source_of(core, dev, port)?;
    let rec = PathRecord {
        sgid,
        slid,
        dlid,
        pkey: 0xffff,
        numb_path: 1,
        reversible: true,
        ..PathRecord::default()
    };
    let mask = path_comp::SGID
        | path_comp::SLID
        | path_comp::DLID
        | path_comp::PKEY
        | path_comp::NUMB_PATH
        | path_comp::REVERSIBLE;
    path_wait(core, sa, dev, port, rec, mask, PathKey::Lid(dlid), timeout)
}

/// A path from this port to `dgid` (SGID from the port cache), from the
/// cache or the SA, within `timeout`.
pub fn sa_path_to_gid(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    dgid: Gid,
    timeout: Duration,
) -> Result<PathRecord> {
    let (sgid, _) = source_of(core, dev, port)?;
    let rec = PathRecord {
        sgid,
        dgid,
        pkey: 0xffff,
        numb_path: 1,
        reversible: true,
        ..PathRecord::default()
    };
    let mask = path_comp::SGID
        | path_comp::DGID
        | path_comp::PKEY
        | path_comp::NUMB_PATH
        | path_comp::REVERSIBLE;
    path_wait(core, sa, dev, port, rec, mask, PathKey::Gid(dgid), timeout)
}

/// Every NodeRecord the SA has (`saquery` without arguments): a GetTable
/// with an empty component mask.
pub fn sa_node_records(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    timeout: Duration,
) -> Result<Vec<NodeRecord>> {
    let id = ib_sa_node_rec_get(
        core,
        sa,
        dev,
        port,
        &NodeRecord::default(),
        0,
        true,
        timeout,
    )?;
    ib_sa_wait(core, sa, id, timeout)?.node_records()
}

/// The PortInfoRecords of the port at `lid` (GetTable by EndportLID).
pub fn sa_portinfo_records(
    core: &mut IbCore,
    sa: ClientId,
    dev: DeviceId,
    port: u8,
    lid: u16,
    timeout: Duration,
) -> Result<Vec<PortInfoRecord>> {
    let rec = PortInfoRecord {
        lid,
        ..PortInfoRecord::default()
    };
    let id = ib_sa_portinfo_rec_get(core, sa, dev, port, &rec, portinfo_comp::LID, true, timeout)?;
    ib_sa_wait(core, sa, id, timeout)?.portinfo_records()
}

/// What the SA client of a port counted.
pub fn sa_counters(core: &mut IbCore, sa: ClientId, dev: DeviceId, port: u8) -> Option<SaCounters> {
    with_sa(core, sa, dev, |_, sd| Ok(port_of(sd, port)?.counters)).ok()
}

/// The SA's address as the client last read it (None: not read yet, or
/// the port has no SM).
pub fn sa_sm_ah(core: &mut IbCore, sa: ClientId, dev: DeviceId, port: u8) -> Option<SmAh> {
    with_sa(core, sa, dev, |_, sd| Ok(port_of(sd, port)?.sm_ah))
        .ok()
        .flatten()
}

/// `ib_init_ah_from_path`: the address vector of a path from `port` (a GRH
/// when the path leaves the subnet, hop limit above 1, with the SGID's
/// index from the cache; source path bits from the SLID and the LMC).
pub fn ib_init_ah_from_path(dev: &Device, port: u8, rec: &PathRecord) -> Result<AhAttr> {
    let lmc = dev.get_cached_lmc(port)?;
    let mut ah = AhAttr {
        dlid: rec.dlid,
        sl: rec.sl & 0xf,
        src_path_bits: (rec.slid & ((1u16 << lmc.min(7)) - 1)) as u8,
        static_rate: rec.rate,
        port_num: port,
        grh: None,
    };
    if rec.hop_limit > 1 {
        let c = dev.port_cache(port)?;
        let idx = c
            .find_gid(&rec.sgid)
            .ok_or(Error::Invalid("path SGID is not in the port's GID table"))?;
        ah.grh = Some(GlobalRoute {
            dgid: rec.dgid,
            flow_label: rec.flow_label,
            sgid_index: u8::try_from(idx).map_err(|_| Error::Invalid("SGID index above 255"))?,
            hop_limit: rec.hop_limit,
            traffic_class: rec.traffic_class,
        });
    }
    Ok(ah)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn sa_mad_header_golden_bytes() {
        let m = ib_sa_build_mad(
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
        assert!(ib_sa_build_mad(method::GET, 1, 0, &[0; 201]).is_err());
        // Component mask constants, as OpenSM and Linux number them.
        assert_eq!(path_comp::DGID, 0x4);
        assert_eq!(path_comp::PKEY, 0x2000);
        assert_eq!(path_comp::PREFERENCE, 0x40_0000);
        assert_eq!(node_comp::NODE_DESC, 0x4000);
        assert_eq!(portinfo_comp::PORT_NUM, 0x2);
    }

    #[test]
    fn get_table_records_split_by_attr_offset() {
        let mut m =
            ib_sa_build_mad(sa_method::GET_TABLE_RESP, sa_attr::PORT_INFO_REC, 0, &[]).unwrap();
        m.set_method(sa_method::GET_TABLE_RESP);
        sa_set_attr_offset(&mut m, 9);
        // RMPP active, single segment, payload 20 + 2 * 72.
        m.0[26] = 0x01 | 0x06;
        m.0[32..36].copy_from_slice(&(20u32 + 144).to_be_bytes());
        m.0[56] = 0x11;
        m.0[56 + 72] = 0x22;
        let r = response_records(&m, None, 68).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0][0], 0x11);
        assert_eq!(r[1][0], 0x22);
        // Attribute offset 0: no records.
        sa_set_attr_offset(&mut m, 0);
        assert!(response_records(&m, None, 68).unwrap().is_empty());
        // Shorter than the record: refused.
        sa_set_attr_offset(&mut m, 2);
        assert!(response_records(&m, None, 68).is_err());
        // A huge payload length is clamped to one MAD.
        sa_set_attr_offset(&mut m, 9);
        m.0[32..36].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(response_records(&m, None, 68).unwrap().len(), 2);
    }
}
