//! Port of Linux `drivers/infiniband/core/cm_msgs.h` (3.11): the IB CM messages REQ, MRA, REJ, REP, RTU, DREQ and DREP (IBTA Vol. 1 12.6) as host-order structs packed into and read from a MAD.
//!
//! SIDR_REQ and SIDR_REP (IBTA 12.11) are here too. LAP and APR are only
//! named (the CM refuses them), and alternate paths are carried but never
//! used.

use alloc::vec::Vec;

use crate::error::{Error, Result};
use crate::mad::{Mad, class, method};
use crate::verbs::Gid;
use hal::be::{get_be16, get_be32, get_be64, put_be16, put_be32, put_be64};

/// CM class version (`IB_CM_CLASS_VERSION`).
pub const IB_CM_CLASS_VERSION: u8 = 2;

/// CM attribute IDs (`CM_*_ATTR_ID`).
pub mod cm_attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// REQ.
    pub const REQ: u16 = 0x0010;
    /// MRA.
    pub const MRA: u16 = 0x0011;
    /// REJ.
    pub const REJ: u16 = 0x0012;
    /// REP.
    pub const REP: u16 = 0x0013;
    /// RTU.
    pub const RTU: u16 = 0x0014;
    /// DREQ.
    pub const DREQ: u16 = 0x0015;
    /// DREP.
    pub const DREP: u16 = 0x0016;
    /// SIDR_REQ.
    pub const SIDR_REQ: u16 = 0x0017;
    /// SIDR_REP.
    pub const SIDR_REP: u16 = 0x0018;
    /// LAP.
    pub const LAP: u16 = 0x0019;
    /// APR.
    pub const APR: u16 = 0x001a;
}

/// REJ reasons (`enum ib_cm_rej_reason`, IBTA Table 112).
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No EEC available.
    pub const NO_EEC: u16 = 2;
    /// No resources available.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout.
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// Invalid service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// RDC does not exist.
    pub const RDC_NOT_EXIST: u16 = 11;
    /// Invalid GID.
    pub const INVALID_GID: u16 = 12;
    /// Invalid LID.
    pub const INVALID_LID: u16 = 13;
    /// Invalid SL.
    pub const INVALID_SL: u16 = 14;
    /// Invalid MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: u16 = 27;
    /// Consumer reject.
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid RNR retry count.
    pub const INVALID_RNR_RETRY: u16 = 29;
    /// Duplicate local communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    /// Invalid class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
}

/// The name Linux's `ib_cm_rej_reason` gives a reason.
pub fn rej_reason_str(r: u16) -> &'static str {
    match r {
        1 => "IB_CM_REJ_NO_QP",
        2 => "IB_CM_REJ_NO_EEC",
        3 => "IB_CM_REJ_NO_RESOURCES",
        4 => "IB_CM_REJ_TIMEOUT",
        5 => "IB_CM_REJ_UNSUPPORTED",
        6 => "IB_CM_REJ_INVALID_COMM_ID",
        7 => "IB_CM_REJ_INVALID_COMM_INSTANCE",
        8 => "IB_CM_REJ_INVALID_SERVICE_ID",
        9 => "IB_CM_REJ_INVALID_TRANSPORT_TYPE",
        10 => "IB_CM_REJ_STALE_CONN",
        11 => "IB_CM_REJ_RDC_NOT_EXIST",
        12 => "IB_CM_REJ_INVALID_GID",
        13 => "IB_CM_REJ_INVALID_LID",
        14 => "IB_CM_REJ_INVALID_SL",
        26 => "IB_CM_REJ_INVALID_MTU",
        27 => "IB_CM_REJ_INSUFFICIENT_RESP_RESOURCES",
        28 => "IB_CM_REJ_CONSUMER_DEFINED",
        29 => "IB_CM_REJ_INVALID_RNR_RETRY",
        30 => "IB_CM_REJ_DUPLICATE_LOCAL_COMM_ID",
        31 => "IB_CM_REJ_INVALID_CLASS_VERSION",
        _ => "IB_CM_REJ_(other)",
    }
}

/// Which message a REJ or MRA answers (`enum cm_msg_response`).
pub mod msg_response {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Another message (LAP).
    pub const OTHER: u8 = 2;
}

/// Private data lengths (`IB_CM_*_PRIVATE_DATA_SIZE`).
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// SIDR_REP status (`enum ib_cm_sidr_status`, IBTA Table 118).
pub mod sidr_status {
    /// The service is there: QPN and Q_Key are valid.
    pub const SUCCESS: u8 = 0;
    /// No one serves this service ID.
    pub const UNSUPPORTED: u8 = 1;
    /// The consumer refused.
    pub const REJECT: u8 = 2;
    /// No QP for the service.
    pub const NO_QP: u8 = 3;
    /// Redirected (ClassPortInfo in the additional information).
    pub const REDIRECT: u8 = 4;
    /// Unsupported class version.
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// Bytes of a SIDR_REP's additional information (`IB_CM_SIDR_REP_INFO_LENGTH`).
pub const IB_CM_SIDR_REP_INFO_LENGTH: usize = 72;

/// APR status "unsupported" (`IB_CM_APR_UNSUPPORTED`), the answer to a LAP
/// by a CM without path migration; the APR's status byte is at offset 33.
pub const IB_CM_APR_UNSUPPORTED: u8 = 2;

/// Bytes of a REJ's additional rejection information.
pub const IB_CM_REJ_ARI_LENGTH: usize = 72;

fn gid(b: &[u8], o: usize) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[o..o + 16]);
    Gid(g)
}

/// A CM MAD with the header filled in (method Send).
pub fn cm_mad(attr_id: u16) -> Mad {
    Mad::new_request(class::CM, IB_CM_CLASS_VERSION, method::SEND, attr_id, 0)
}

fn put_private(m: &mut Mad, off: usize, max: usize, data: &[u8]) -> Result<()> {
    if data.len() > max {
        return Err(Error::MsgSize);
    }
    m.0[off..off + data.len()].copy_from_slice(data);
    Ok(())
}

/// One path of a REQ (primary or alternate), IBTA 12.6.5 bytes 44-87.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmReqPath {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, `ib_rate`).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// SL (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl CmReqPath {
    fn pack(&self, b: &mut [u8], o: usize) {
        put_be16(b, o, self.local_lid);
        put_be16(b, o + 2, self.remote_lid);
        b[o + 4..o + 20].copy_from_slice(&self.local_gid.0);
        b[o + 20..o + 36].copy_from_slice(&self.remote_gid.0);
        put_be32(
            b,
            o + 36,
            ((self.flow_label & 0xf_ffff) << 12) | u32::from(self.packet_rate & 0x3f),
        );
        b[o + 40] = self.traffic_class;
        b[o + 41] = self.hop_limit;
        b[o + 42] = ((self.sl & 0xf) << 4) | (u8::from(self.subnet_local) << 3);
        b[o + 43] = (self.local_ack_timeout & 0x1f) << 3;
    }
    fn unpack(b: &[u8], o: usize) -> CmReqPath {
        let w = get_be32(b, o + 36);
        CmReqPath {
            local_lid: get_be16(b, o),
            remote_lid: get_be16(b, o + 2),
            local_gid: gid(b, o + 4),
            remote_gid: gid(b, o + 20),
            flow_label: w >> 12,
            packet_rate: (w & 0x3f) as u8,
            traffic_class: b[o + 40],
            hop_limit: b[o + 41],
            sl: b[o + 42] >> 4,
            subnet_local: b[o + 42] & 0x08 != 0,
            local_ack_timeout: b[o + 43] >> 3,
        }
    }
}

/// `struct cm_req_msg`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmReq {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits: 0 RC, 1 UC, 3 RD).
    pub transport_type: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path packet payload MTU (4 bits).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Primary path.
    pub primary: CmReqPath,
    /// Alternate path (all zero: none).
    pub alternate: CmReqPath,
    /// Private data (up to 92 bytes; read back as all 92).
    pub private_data: Vec<u8>,
}

impl CmReq {
    /// The MAD.
    pub fn pack(&self) -> Result<Mad> {
        let mut m = cm_mad(cm_attr::REQ);
        let b = &mut m.0;
        put_be32(b, 24, self.local_comm_id);
        put_be64(b, 32, self.service_id);
        put_be64(b, 40, self.local_ca_guid);
        put_be32(b, 52, self.local_qkey);
        put_be32(
            b,
            56,
            (self.local_qpn << 8) | u32::from(self.responder_resources),
        );
        put_be32(
            b,
            60,
            (self.local_eecn << 8) | u32::from(self.initiator_depth),
        );
        put_be32(
            b,
            64,
            (self.remote_eecn << 8)
                | (u32::from(self.remote_cm_response_timeout & 0x1f) << 3)
                | (u32::from(self.transport_type & 3) << 1)
                | u32::from(self.flow_control),
        );
        put_be32(
            b,
            68,
            (self.starting_psn << 8)
                | (u32::from(self.local_cm_response_timeout & 0x1f) << 3)
                | u32::from(self.retry_count & 7),
        );
        put_be16(b, 72, self.pkey);
        b[74] = ((self.path_mtu & 0xf) << 4)
            | (u8::from(self.rdc_exists) << 3)
            | (self.rnr_retry_count & 7);
        b[75] = ((self.max_cm_retries & 0xf) << 4) | (u8::from(self.srq) << 3);
        self.primary.pack(b, 76);
        self.alternate.pack(b, 120);
        put_private(&mut m, 164, private_len::REQ, &self.private_data)?;
        Ok(m)
    }

    /// From a MAD.
    pub fn unpack(m: &Mad) -> CmReq {
        let b = &m.0;
        let w64 = get_be32(b, 64);
        let w68 = get_be32(b, 68);
        CmReq {
            local_comm_id: get_be32(b, 24),
            service_id: get_be64(b, 32),
            local_ca_guid: get_be64(b, 40),
            local_qkey: get_be32(b, 52),
            local_qpn: get_be32(b, 56) >> 8,
            responder_resources: b[59],
            local_eecn: get_be32(b, 60) >> 8,
            initiator_depth: b[63],
            remote_eecn: w64 >> 8,
            remote_cm_response_timeout: ((w64 >> 3) & 0x1f) as u8,
            transport_type: ((w64 >> 1) & 3) as u8,
            flow_control: w64 & 1 != 0,
            starting_psn: w68 >> 8,
            local_cm_response_timeout: ((w68 >> 3) & 0x1f) as u8,
            retry_count: (w68 & 7) as u8,
            pkey: get_be16(b, 72),
            path_mtu: b[74] >> 4,
            rdc_exists: b[74] & 0x08 != 0,
            rnr_retry_count: b[74] & 7,
            max_cm_retries: b[75] >> 4,
            srq: b[75] & 0x08 != 0,
            primary: CmReqPath::unpack(b, 76),
            alternate: CmReqPath::unpack(b, 120),
            private_data: b[164..164 + private_len::REQ].to_vec(),
        }
    }
}

/// `struct cm_rep_msg`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmRep {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EEC number (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data (up to 196 bytes).
    pub private_data: Vec<u8>,
}

impl CmRep {
    /// The MAD.
    pub fn pack(&self) -> Result<Mad> {
        let mut m = cm_mad(cm_attr::REP);
        let b = &mut m.0;
        put_be32(b, 24, self.local_comm_id);
        put_be32(b, 28, self.remote_comm_id);
        put_be32(b, 32, self.local_qkey);
        put_be32(b, 36, self.local_qpn << 8);
        put_be32(b, 40, self.local_eecn << 8);
        put_be32(b, 44, self.starting_psn << 8);
        b[48] = self.responder_resources;
        b[49] = self.initiator_depth;
        b[50] = ((self.target_ack_delay & 0x1f) << 3)
            | ((self.failover_accepted & 3) << 1)
            | u8::from(self.flow_control);
        b[51] = ((self.rnr_retry_count & 7) << 5) | (u8::from(self.srq) << 4);
        put_be64(b, 52, self.local_ca_guid);
        put_private(&mut m, 60, private_len::REP, &self.private_data)?;
        Ok(m)
    }
    /// From a MAD.
    pub fn unpack(m: &Mad) -> CmRep {
        let b = &m.0;
        CmRep {
            local_comm_id: get_be32(b, 24),
            remote_comm_id: get_be32(b, 28),
            local_qkey: get_be32(b, 32),
            local_qpn: get_be32(b, 36) >> 8,
            local_eecn: get_be32(b, 40) >> 8,
            starting_psn: get_be32(b, 44) >> 8,
            responder_resources: b[48],
            initiator_depth: b[49],
            target_ack_delay: b[50] >> 3,
            failover_accepted: (b[50] >> 1) & 3,
            flow_control: b[50] & 1 != 0,
            rnr_retry_count: b[51] >> 5,
            srq: b[51] & 0x10 != 0,
            local_ca_guid: get_be64(b, 52),
            private_data: b[60..60 + private_len::REP].to_vec(),
        }
    }
}

/// `struct cm_rej_msg`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmRej {
    /// Local communication ID (0 if none).
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Message rejected ([`msg_response`]).
    pub msg_rejected: u8,
    /// Reason ([`rej_reason`]).
    pub reason: u16,
    /// Additional rejection information (up to 72 bytes; its length is
    /// sent).
    pub ari: Vec<u8>,
    /// Private data (up to 148 bytes).
    pub private_data: Vec<u8>,
}

impl CmRej {
    /// The MAD.
    pub fn pack(&self) -> Result<Mad> {
        let mut m = cm_mad(cm_attr::REJ);
        if self.ari.len() > IB_CM_REJ_ARI_LENGTH {
            return Err(Error::MsgSize);
        }
        let b = &mut m.0;
        put_be32(b, 24, self.local_comm_id);
        put_be32(b, 28, self.remote_comm_id);
        b[32] = (self.msg_rejected & 3) << 6;
        b[33] = (self.ari.len() as u8) << 1;
        put_be16(b, 34, self.reason);
        b[36..36 + self.ari.len()].copy_from_slice(&self.ari);
        put_private(&mut m, 108, private_len::REJ, &self.private_data)?;
        Ok(m)
    }
    /// From a MAD (an ARI length beyond 72 is cut to 72).
    pub fn unpack(m: &Mad) -> CmRej {
        let b = &m.0;
        let ari_len = usize::from(b[33] >> 1).min(IB_CM_REJ_ARI_LENGTH);
        CmRej {
            local_comm_id: get_be32(b, 24),
            remote_comm_id: get_be32(b, 28),
            msg_rejected: b[32] >> 6,
            reason: get_be16(b, 34),
            ari: b[36..36 + ari_len].to_vec(),
            private_data: b[108..108 + private_len::REJ].to_vec(),
        }
    }
}

/// `struct cm_mra_msg`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmMra {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Message MRAed ([`msg_response`]).
    pub msg_mraed: u8,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data (up to 222 bytes).
    pub private_data: Vec<u8>,
}

impl CmMra {
    /// The MAD.
    pub fn pack(&self) -> Result<Mad> {
        let mut m = cm_mad(cm_attr::MRA);
        let b = &mut m.0;
        put_be32(b, 24, self.local_comm_id);
        put_be32(b, 28, self.remote_comm_id);
        b[32] = (self.msg_mraed & 3) << 6;
        b[33] = (self.service_timeout & 0x1f) << 3;
        put_private(&mut m, 34, private_len::MRA, &self.private_data)?;
        Ok(m)
    }
    /// From a MAD.
    pub fn unpack(m: &Mad) -> CmMra {
        let b = &m.0;
        CmMra {
            local_comm_id: get_be32(b, 24),
            remote_comm_id: get_be32(b, 28),
            msg_mraed: b[32] >> 6,
            service_timeout: b[33] >> 3,
            private_data: b[34..34 + private_len::MRA].to_vec(),
        }
    }
}

/// RTU, DREQ and DREP share a shape: two comm IDs, (DREQ: the remote QPN),
/// private data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmIds {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// DREQ only: remote QPN/EECN (24 bits).
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl CmIds {
    fn layout(attr_id: u16) -> Result<(usize, usize)> {
        match attr_id {
            cm_attr::RTU => Ok((32, private_len::RTU)),
            cm_attr::DREQ => Ok((36, private_len::DREQ)),
            cm_attr::DREP => Ok((32, private_len::DREP)),
            _ => Err(Error::Invalid("not an RTU, DREQ or DREP")),
        }
    }
    /// The MAD of an RTU, DREQ or DREP.
    pub fn pack(&self, attr_id: u16) -> Result<Mad> {
        let (off, len) = Self::layout(attr_id)?;
        let mut m = cm_mad(attr_id);
        put_be32(&mut m.0, 24, self.local_comm_id);
        put_be32(&mut m.0, 28, self.remote_comm_id);
        if attr_id == cm_attr::DREQ {
            put_be32(&mut m.0, 32, self.remote_qpn << 8);
        }
        put_private(&mut m, off, len, &self.private_data)?;
        Ok(m)
    }
    /// From the MAD of an RTU, DREQ or DREP.
    pub fn unpack(m: &Mad) -> Result<CmIds> {
        let (off, len) = Self::layout(m.attr_id())?;
        let b = &m.0;
        Ok(CmIds {
            local_comm_id: get_be32(b, 24),
            remote_comm_id: get_be32(b, 28),
            remote_qpn: if m.attr_id() == cm_attr::DREQ {
                get_be32(b, 32) >> 8
            } else {
                0
            },
            private_data: b[off..off + len].to_vec(),
        })
    }
}

/// `struct cm_sidr_req_msg`: request ID at 24, P_Key at 28, service ID at
/// 32, 216 bytes of private data at 40.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmSidrReq {
    /// Request ID (the requester's ID for it).
    pub request_id: u32,
    /// P_Key of the path.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl CmSidrReq {
    /// The MAD.
    pub fn pack(&self) -> Result<Mad> {
        let mut m = cm_mad(cm_attr::SIDR_REQ);
        put_be32(&mut m.0, 24, self.request_id);
        put_be16(&mut m.0, 28, self.pkey);
        put_be64(&mut m.0, 32, self.service_id);
        put_private(&mut m, 40, private_len::SIDR_REQ, &self.private_data)?;
        Ok(m)
    }
    /// From the MAD.
    pub fn unpack(m: &Mad) -> CmSidrReq {
        let b = &m.0;
        CmSidrReq {
            request_id: get_be32(b, 24),
            pkey: get_be16(b, 28),
            service_id: get_be64(b, 32),
            private_data: b[40..40 + private_len::SIDR_REQ].to_vec(),
        }
    }
}

/// `struct cm_sidr_rep_msg`: request ID at 24, status 28, additional
/// information length 29, QPN (24 bits) at 32, service ID 36, Q_Key 44,
/// 72 bytes of additional information at 48, 136 bytes of private data at
/// 120.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmSidrRep {
    /// The request ID of the SIDR_REQ answered.
    pub request_id: u32,
    /// Status ([`sidr_status`]).
    pub status: u8,
    /// Bytes of `info` that matter.
    pub info_length: u8,
    /// The service's QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// The service's Q_Key.
    pub qkey: u32,
    /// Additional information (ClassPortInfo on a redirect).
    pub info: Vec<u8>,
    /// Private data.
    pub private_data: Vec<u8>,
}

impl CmSidrRep {
    /// The MAD.
    pub fn pack(&self) -> Result<Mad> {
        let mut m = cm_mad(cm_attr::SIDR_REP);
        put_be32(&mut m.0, 24, self.request_id);
        m.0[28] = self.status;
        m.0[29] = self.info_length;
        put_be32(&mut m.0, 32, (self.qpn & 0xff_ffff) << 8);
        put_be64(&mut m.0, 36, self.service_id);
        put_be32(&mut m.0, 44, self.qkey);
        put_private(&mut m, 48, IB_CM_SIDR_REP_INFO_LENGTH, &self.info)?;
        put_private(&mut m, 120, private_len::SIDR_REP, &self.private_data)?;
        Ok(m)
    }
    /// From the MAD.
    pub fn unpack(m: &Mad) -> CmSidrRep {
        let b = &m.0;
        CmSidrRep {
            request_id: get_be32(b, 24),
            status: b[28],
            info_length: b[29],
            qpn: get_be32(b, 32) >> 8,
            service_id: get_be64(b, 36),
            qkey: get_be32(b, 44),
            info: b[48..48 + IB_CM_SIDR_REP_INFO_LENGTH].to_vec(),
            private_data: b[120..120 + private_len::SIDR_REP].to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidr_golden_bytes() {
        let r = CmSidrReq {
            request_id: 0x0102_0304,
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_1c06,
            private_data: vec![0x00, 0x40, 0x1c, 0x06],
        };
        let m = r.pack().unwrap();
        assert_eq!(m.attr_id(), cm_attr::SIDR_REQ);
        assert_eq!(&m.0[24..32], &[1, 2, 3, 4, 0xff, 0xff, 0, 0]);
        assert_eq!(&m.0[32..40], &[0, 0, 0, 0, 1, 0x11, 0x1c, 0x06]);
        assert_eq!(&m.0[40..44], &[0x00, 0x40, 0x1c, 0x06]);
        let mut back = CmSidrReq::unpack(&m);
        back.private_data.truncate(4);
        assert_eq!(back, r);
        let p = CmSidrRep {
            request_id: 0x0102_0304,
            status: sidr_status::SUCCESS,
            info_length: 0,
            qpn: 0x48,
            service_id: 0x0000_0000_0111_1c06,
            qkey: 0x0123_4567,
            info: Vec::new(),
            private_data: b"ok".to_vec(),
        };
        let m = p.pack().unwrap();
        assert_eq!(&m.0[24..30], &[1, 2, 3, 4, 0, 0]);
        assert_eq!(&m.0[32..36], &[0, 0, 0x48, 0]);
        assert_eq!(&m.0[44..48], &[0x01, 0x23, 0x45, 0x67]);
        assert_eq!(&m.0[120..122], b"ok");
        let back = CmSidrRep::unpack(&m);
        assert_eq!((back.qpn, back.qkey, back.status), (0x48, 0x0123_4567, 0));
        assert!(
            CmSidrReq {
                private_data: vec![0; 217],
                ..CmSidrReq::default()
            }
            .pack()
            .is_err()
        );
    }

    #[test]
    fn req_golden_bytes() {
        let r = CmReq {
            local_comm_id: 0x1122_3344,
            service_id: 0x0000_0000_0001_0000 | 0x1234,
            local_ca_guid: 0x0002_c903_0000_0a00,
            local_qkey: 0,
            local_qpn: 0x00_0048,
            responder_resources: 4,
            local_eecn: 0,
            initiator_depth: 3,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_type: 0,
            flow_control: true,
            starting_psn: 0xab_cdef,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 4,
            rdc_exists: false,
            rnr_retry_count: 6,
            max_cm_retries: 15,
            srq: false,
            primary: CmReqPath {
                local_lid: 10,
                remote_lid: 20,
                local_gid: Gid::new(0xfe80 << 48, 0x0a),
                remote_gid: Gid::new(0xfe80 << 48, 0x0b),
                flow_label: 0x12345,
                packet_rate: 7,
                traffic_class: 0x21,
                hop_limit: 0,
                sl: 3,
                subnet_local: true,
                local_ack_timeout: 15,
            },
            alternate: CmReqPath::default(),
            private_data: b"hello".to_vec(),
        };
        let m = r.pack().unwrap();
        let b = &m.0;
        assert_eq!(&b[0..4], &[1, 0x07, 2, 0x03]);
        assert_eq!(&b[16..18], &[0, 0x10]);
        assert_eq!(&b[24..28], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&b[28..32], &[0; 4]);
        assert_eq!(&b[32..40], &[0, 0, 0, 0, 0, 1, 0x12, 0x34]);
        assert_eq!(&b[40..48], &[0, 2, 0xc9, 3, 0, 0, 0x0a, 0]);
        assert_eq!(&b[56..60], &[0, 0, 0x48, 4]);
        assert_eq!(&b[60..64], &[0, 0, 0, 3]);
        // remote EECN 0 | timeout 20 << 3 | RC 0 << 1 | flow control 1
        assert_eq!(&b[64..68], &[0, 0, 0, 0xa1]);
        // PSN 0xabcdef | timeout 20 << 3 | retry 7
        assert_eq!(&b[68..72], &[0xab, 0xcd, 0xef, 0xa7]);
        assert_eq!(&b[72..76], &[0xff, 0xff, 0x46, 0xf0]);
        assert_eq!(&b[76..80], &[0, 10, 0, 20]);
        assert_eq!(b[80], 0xfe);
        assert_eq!(b[95], 0x0a);
        assert_eq!(b[111], 0x0b);
        // flow label 0x12345 << 12 | rate 7
        assert_eq!(&b[112..116], &[0x12, 0x34, 0x50, 0x07]);
        assert_eq!(&b[116..120], &[0x21, 0, 0x38, 15 << 3]);
        assert_eq!(&b[120..164], &[0; 44]);
        assert_eq!(&b[164..169], b"hello");
        let back = CmReq::unpack(&m);
        let mut want = r.clone();
        want.private_data.resize(92, 0);
        assert_eq!(back, want);
    }

    #[test]
    fn rep_rej_mra_golden_bytes() {
        let rep = CmRep {
            local_comm_id: 1,
            remote_comm_id: 2,
            local_qkey: 0,
            local_qpn: 0x4a,
            local_eecn: 0,
            starting_psn: 0x12_3456,
            responder_resources: 4,
            initiator_depth: 2,
            target_ack_delay: 15,
            failover_accepted: 1,
            flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 0x0102_0304_0506_0708,
            private_data: vec![0xee; 196],
        };
        let m = rep.pack().unwrap();
        let b = &m.0;
        assert_eq!(&b[16..18], &[0, 0x13]);
        assert_eq!(&b[24..32], &[0, 0, 0, 1, 0, 0, 0, 2]);
        assert_eq!(&b[36..40], &[0, 0, 0x4a, 0]);
        assert_eq!(&b[44..48], &[0x12, 0x34, 0x56, 0]);
        assert_eq!(&b[48..52], &[4, 2, 0x7b, 0xf0]);
        assert_eq!(&b[52..60], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b[60], 0xee);
        assert_eq!(b[255], 0xee);
        assert_eq!(CmRep::unpack(&m), rep);
        assert!(
            CmRep {
                private_data: vec![0; 197],
                ..CmRep::default()
            }
            .pack()
            .is_err()
        );

        let rej = CmRej {
            local_comm_id: 5,
            remote_comm_id: 6,
            msg_rejected: msg_response::REP,
            reason: rej_reason::CONSUMER_DEFINED,
            ari: vec![9, 8, 7],
            private_data: b"no".to_vec(),
        };
        let m = rej.pack().unwrap();
        let b = &m.0;
        assert_eq!(&b[16..18], &[0, 0x12]);
        assert_eq!(&b[32..38], &[0x40, 3 << 1, 0, 28, 9, 8]);
        assert_eq!(&b[108..110], b"no");
        let back = CmRej::unpack(&m);
        assert_eq!(
            (back.reason, back.ari.clone(), back.msg_rejected),
            (28, vec![9, 8, 7], 1)
        );
        assert_eq!(&back.private_data[..2], b"no");

        let mra = CmMra {
            local_comm_id: 7,
            remote_comm_id: 8,
            msg_mraed: msg_response::REQ,
            service_timeout: 21,
            private_data: vec![1],
        };
        let m = mra.pack().unwrap();
        assert_eq!(&m.0[16..18], &[0, 0x11]);
        assert_eq!(&m.0[32..35], &[0, 21 << 3, 1]);
        assert_eq!(CmMra::unpack(&m).service_timeout, 21);

        let dreq = CmIds {
            local_comm_id: 1,
            remote_comm_id: 2,
            remote_qpn: 0x4a,
            private_data: vec![3],
        };
        let m = dreq.pack(cm_attr::DREQ).unwrap();
        assert_eq!(&m.0[16..18], &[0, 0x15]);
        assert_eq!(&m.0[24..37], &[0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0x4a, 0, 3]);
        assert_eq!(CmIds::unpack(&m).unwrap().remote_qpn, 0x4a);
        let m = dreq.pack(cm_attr::DREP).unwrap();
        assert_eq!(&m.0[30..33], &[0, 2, 3]);
        let m = dreq.pack(cm_attr::RTU).unwrap();
        assert_eq!(&m.0[16..18], &[0, 0x14]);
        assert!(dreq.pack(cm_attr::REQ).is_err());
        // An ARI length field beyond 72 is cut, never read past.
        let mut m = rej.pack().unwrap();
        m.0[33] = 0xfe;
        assert_eq!(CmRej::unpack(&m).ari.len(), 72);
    }
}
