//! The subnet administrator beside the embedded SM, after OpenSM's `osm_sa.c` (`osm_sa_respond`, `osm_sa_send_error`) and `osm_sa_mad_ctrl.c`.
//!
//! SubnAdmGet, GetTable, GetMulti, Set and Delete of the records in this
//! directory, answered from the SM's last heavy sweep (LIDs, topology,
//! LFTs and MFTs as computed) and the SA's own state (multicast groups,
//! services). As OpenSM 3.3.23 answers: a MAD whose SM_Key is neither 0
//! nor the SM's is dropped, as is one from a LID outside the subnet, one
//! of a method OpenSM does not take, of an attribute it does not serve
//! (ERR 1A01) or of a base version other than 1; a class version other
//! than 2 is what the host's MAD layer answers for OpenSM (a Get or Set:
//! status 0x000C, anything else dropped); a Get with several records is
//! TOO_MANY_RECORDS, one with none NO_RECORDS; a GetTable (or GetMulti)
//! answer is a table of any length, sent as RMPP by the SM
//! ([`super::sm`]). The SA answers only while the SM is master and its
//! first sweep is done (the SM checks that).
//!
//! Left out of OpenSM: InformInfo and report forwarding, GUIDInfo, P_Key,
//! SL-to-VL, VL arbitration and trace records, partitions other than the
//! default one, QoS levels, routers and the SA database file.
//!
//! Layouts are the IBTA's (vol. 1, 15.2.1 SA MAD: RMPP header at byte 24,
//! SM_Key at 36, AttributeOffset at 44, ComponentMask at 48, data at 56;
//! the records of 15.2.5).

pub mod class_port_info;
pub mod lft_record;
pub mod link_record;
pub mod mcmember_record;
pub mod mft_record;
pub mod multipath_record;
pub mod node_record;
pub mod path_record;
pub mod portinfo_record;
pub mod service_record;
pub mod sminfo_record;
pub mod sw_info_record;

use std::collections::BTreeMap;

use super::sm::{EndPort, SmConfig};
use crate::fabric::packet::{MAD_LEN, MadHdr, mad_status, method};

pub use mcmember_record::{Group, McastState, Member};
pub use service_record::Service;

/// SA class version.
pub const SA_CLASS_VERSION: u8 = 2;
/// Offset of the SA header's SM_Key.
pub const SA_SM_KEY: usize = 36;
/// Offset of the AttributeOffset (8-byte words).
pub const SA_ATTR_OFFSET: usize = 44;
/// Offset of the ComponentMask.
pub const SA_COMP_MASK: usize = 48;
/// Offset of the SA data.
pub const SA_DATA: usize = 56;
/// Bytes of SA data in one MAD.
pub const SA_DATA_LEN: usize = 200;

/// SA attribute ids.
pub mod sa_attr {
    #![allow(missing_docs)]
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const NODE_RECORD: u16 = 0x0011;
    pub const PORTINFO_RECORD: u16 = 0x0012;
    pub const SWITCH_INFO_RECORD: u16 = 0x0014;
    pub const LFT_RECORD: u16 = 0x0015;
    pub const MFT_RECORD: u16 = 0x0017;
    pub const SMINFO_RECORD: u16 = 0x0018;
    pub const LINK_RECORD: u16 = 0x0020;
    pub const SERVICE_RECORD: u16 = 0x0031;
    pub const PATH_RECORD: u16 = 0x0035;
    pub const MCMEMBER_RECORD: u16 = 0x0038;
    pub const MULTIPATH_RECORD: u16 = 0x003a;
}

/// SA methods beyond Get and Set.
pub mod sa_method {
    #![allow(missing_docs)]
    pub const GET_TABLE: u8 = 0x12;
    pub const GET_MULTI: u8 = 0x14;
    pub const DELETE: u8 = 0x15;
}

/// GetTableResp.
pub const GET_TABLE_RESP: u8 = 0x92;

/// SA status codes (class-specific, MAD status bits 14:8).
pub mod sa_status {
    #![allow(missing_docs)]
    pub const NO_RESOURCES: u16 = 0x0100;
    pub const REQ_INVALID: u16 = 0x0200;
    pub const NO_RECORDS: u16 = 0x0300;
    pub const TOO_MANY_RECORDS: u16 = 0x0400;
    pub const INVALID_GID: u16 = 0x0500;
    pub const INSUFFICIENT_COMPONENTS: u16 = 0x0600;
}

/// Record sizes (unpadded; AttributeOffset pads to 8 bytes).
pub const PATH_RECORD_LEN: usize = path_record::PATH_RECORD_LEN;
/// NodeRecord: LID, reserved, NodeInfo (40), NodeDescription (64).
pub const NODE_RECORD_LEN: usize = node_record::NODE_RECORD_LEN;
/// PortInfoRecord: EndportLID, PortNum, Options, PortInfo (64).
pub const PORTINFO_RECORD_LEN: usize = portinfo_record::PORTINFO_RECORD_LEN;

/// A record's size padded to whole 8-byte words.
pub fn padded(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// Whether component `bit` is in the mask `cm`.
pub fn has(cm: u64, bit: u32) -> bool {
    bit < 64 && cm & (1u64 << bit) != 0
}

pub(crate) fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
pub(crate) fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
pub(crate) fn be64(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(x)
}

/// A GID of `prefix` and `guid`.
pub fn gid(prefix: u64, guid: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&prefix.to_be_bytes());
    g[8..].copy_from_slice(&guid.to_be_bytes());
    g
}

/// The link-local GID prefix, which every SA takes as its own.
pub const LINK_LOCAL_PREFIX: u64 = 0xfe80_0000_0000_0000;

/// One SM the SA lists in SMInfoRecords (this SM first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmRow {
    /// The SM port's LID.
    pub lid: u16,
    /// Its port GUID.
    pub guid: u64,
    /// ActCount.
    pub act_count: u32,
    /// Priority.
    pub priority: u8,
    /// SMState.
    pub state: u8,
}

static NO_SWITCH_INFOS: BTreeMap<u64, [u8; 64]> = BTreeMap::new();
static NO_MFTS: BTreeMap<u64, Vec<u64>> = BTreeMap::new();

/// What the SA reads: the SM's last sweep.
#[derive(Debug)]
pub struct View<'a> {
    /// End ports (CA ports, switch port 0) with their LIDs.
    pub ports: &'a [EndPort],
    /// Per switch (node GUID) the LFT the SM computed.
    pub lfts: &'a BTreeMap<u64, Vec<u8>>,
    /// Cables: (node GUID, port) -> (node GUID, port).
    pub links: &'a BTreeMap<(u64, u8), (u64, u8)>,
    /// Per (node GUID, port) the PortInfo read in the last sweep.
    pub port_infos: &'a BTreeMap<(u64, u8), [u8; 64]>,
    /// The SM's configuration.
    pub cfg: &'a SmConfig,
    /// The SM's LID.
    pub sm_lid: u16,
    /// Per switch (node GUID) its SwitchInfo as last read or set.
    pub switch_infos: &'a BTreeMap<u64, [u8; 64]>,
    /// Per switch the MFT the SM computed: a port mask per MLID from
    /// 0xC000.
    pub mfts: &'a BTreeMap<u64, Vec<u64>>,
    /// This SM and the other SMs it knows.
    pub sms: &'a [SmRow],
}

impl<'a> View<'a> {
    /// A view of end ports, LFTs, cables and PortInfos alone (no switch
    /// information, MFTs or SMs).
    pub fn new(
        ports: &'a [EndPort],
        lfts: &'a BTreeMap<u64, Vec<u8>>,
        links: &'a BTreeMap<(u64, u8), (u64, u8)>,
        port_infos: &'a BTreeMap<(u64, u8), [u8; 64]>,
        cfg: &'a SmConfig,
        sm_lid: u16,
    ) -> View<'a> {
        View {
            ports,
            lfts,
            links,
            port_infos,
            cfg,
            sm_lid,
            switch_infos: &NO_SWITCH_INFOS,
            mfts: &NO_MFTS,
            sms: &[],
        }
    }

    /// The end port with LID `lid`.
    pub fn port_by_lid(&self, lid: u16) -> Option<&'a EndPort> {
        if lid == 0 {
            return None;
        }
        self.ports.iter().find(|p| p.lid == lid)
    }

    /// The end port with GUID `guid`.
    pub fn port_by_guid(&self, guid: u64) -> Option<&'a EndPort> {
        self.ports.iter().find(|p| p.port_guid == guid)
    }

    /// The LID of port `port` of node `node`: a switch's for any of its
    /// ports, a CA port's own.
    pub fn lid_of(&self, node: u64, port: u8) -> u16 {
        self.ports
            .iter()
            .find(|e| e.node_guid == node && (e.node_type == 2 || e.port == port))
            .map_or(0, |e| e.lid)
    }

    /// The switches' end ports (port 0).
    pub fn switches(&self) -> impl Iterator<Item = &'a EndPort> + 'a {
        self.ports.iter().filter(|e| e.node_type == 2)
    }
}

/// The SA's own state: multicast groups and registered services.
#[derive(Debug, Default)]
pub struct SaState {
    /// Multicast groups.
    pub mcast: McastState,
    /// Registered services.
    pub services: Vec<Service>,
}

/// The SA's answer to one MAD.
#[derive(Debug)]
pub struct Answer {
    /// The response MAD (for a table: its headers, the RMPP header and
    /// data left for the sender to fill in per segment).
    pub mad: [u8; MAD_LEN],
    /// A GetTable or GetMulti answer: every record, each padded to
    /// AttributeOffset 8-byte words, to be sent as RMPP segments.
    pub table: Option<Vec<u8>>,
    /// The status is an error.
    pub status_error: bool,
}

/// What a record handler decided.
pub enum Reply {
    /// No answer (OpenSM drops it).
    Drop,
    /// An error status.
    Error(u16),
    /// A ready answer MAD (ClassPortInfo).
    Mad(Box<[u8; MAD_LEN]>),
    /// Records of this (unpadded) size.
    Records(usize, Vec<Vec<u8>>),
}

/// One SA request, as the handlers read it.
pub struct Request<'r> {
    /// The MAD.
    pub mad: &'r [u8; MAD_LEN],
    /// Its header.
    pub hdr: MadHdr,
    /// ComponentMask.
    pub cm: u64,
    /// The requester's LID (the packet's SLID).
    pub requester: u16,
    /// The request carries the SM_Key (a trusted requester).
    pub trusted: bool,
    /// Model time (ns).
    pub now: u64,
}

impl Request<'_> {
    /// The record the request carries (the SA data).
    pub fn rec(&self) -> &[u8] {
        &self.mad[SA_DATA..]
    }
    /// Method.
    pub fn method(&self) -> u8 {
        self.hdr.method
    }
    /// Get or GetTable (the only methods of the read-only records).
    pub fn is_query(&self) -> bool {
        matches!(self.hdr.method, method::GET | sa_method::GET_TABLE)
    }
}

/// What the SM learns from an answer besides the MAD: a join or leave
/// changed a group (the MFTs need writing).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Effects {
    /// A group's members changed.
    pub mcast_changed: bool,
}

/// Answers one SA request MAD from the requester at `requester_lid`, or
/// `None` where OpenSM stays silent. `now` is the model time (service
/// leases).
pub fn answer(
    v: &View,
    st: &mut SaState,
    req: &[u8; MAD_LEN],
    requester_lid: u16,
    now: u64,
) -> Option<Answer> {
    answer_with(v, st, req, requester_lid, now).0
}

/// [`answer`], with what the answer changed.
pub fn answer_with(
    v: &View,
    st: &mut SaState,
    req: &[u8; MAD_LEN],
    requester_lid: u16,
    now: u64,
) -> (Option<Answer>, Effects) {
    let mut fx = Effects::default();
    let Ok(hdr) = MadHdr::parse(req) else {
        return (None, fx);
    };
    if hdr.base_version != 1 || hdr.method & 0x80 != 0 {
        return (None, fx);
    }
    if hdr.class_version != SA_CLASS_VERSION {
        // No SA agent for this class version: the host's MAD layer
        // (Linux `generate_unmatched_resp`) answers a Get or Set.
        if !matches!(hdr.method, method::GET | method::SET) {
            return (None, fx);
        }
        let mut r = *req;
        let mut h = hdr;
        h.method = method::GET_RESP;
        h.status = mad_status::ATTR_UNSUPPORTED;
        h.write(&mut r);
        return (
            Some(Answer {
                mad: r,
                table: None,
                status_error: true,
            }),
            fx,
        );
    }
    // C15-0.1.5: an SM_Key other than 0 or ours: discarded (ERR 1A04).
    let key = be64(req, SA_SM_KEY);
    if key != 0 && key != v.cfg.sm_key {
        return (None, fx);
    }
    if !matches!(
        hdr.method,
        method::GET | method::SET | sa_method::GET_TABLE | sa_method::GET_MULTI | sa_method::DELETE
    ) {
        // ERR 1A05 (a ReportResp is retired silently too).
        return (None, fx);
    }
    // The requester must be a port of the subnet ("Cannot find requester
    // physical port").
    if v.port_by_lid(requester_lid).is_none() {
        return (None, fx);
    }
    let r = Request {
        mad: req,
        hdr,
        cm: be64(req, SA_COMP_MASK),
        requester: requester_lid,
        trusted: key != 0,
        now,
    };
    let reply = match hdr.attr_id {
        sa_attr::CLASS_PORT_INFO => class_port_info::process(v, &r),
        sa_attr::NODE_RECORD => node_record::process(v, &r),
        sa_attr::PORTINFO_RECORD => portinfo_record::process(v, &r),
        sa_attr::LINK_RECORD => link_record::process(v, &r),
        sa_attr::SMINFO_RECORD => sminfo_record::process(v, &r),
        sa_attr::SWITCH_INFO_RECORD => sw_info_record::process(v, &r),
        sa_attr::LFT_RECORD => lft_record::process(v, &r),
        sa_attr::MFT_RECORD => mft_record::process(v, &r),
        sa_attr::PATH_RECORD => path_record::process(v, st, &r),
        sa_attr::MULTIPATH_RECORD => multipath_record::process(v, &r),
        sa_attr::SERVICE_RECORD => service_record::process(v, st, &r),
        sa_attr::MCMEMBER_RECORD => {
            let (rep, changed) = mcmember_record::process(v, st, &r);
            fx.mcast_changed = changed;
            rep
        }
        // ERR 1A01: unsupported attribute, retired.
        _ => Reply::Drop,
    };
    let a = match reply {
        Reply::Drop => None,
        Reply::Error(s) => Some(send_error(req, hdr, s)),
        Reply::Mad(m) => Some(Answer {
            mad: *m,
            table: None,
            status_error: false,
        }),
        Reply::Records(size, recs) => Some(respond(req, hdr, size, recs)),
    };
    (a, fx)
}

/// `osm_sa_send_error`: the request back with status `st` (a Set as a
/// GetResp, a GetTable with AttributeOffset 0, a MultiPathRecord as a
/// PathRecord), SM_Key and RMPP header cleared.
fn send_error(req: &[u8; MAD_LEN], hdr: MadHdr, st: u16) -> Answer {
    let mut r = *req;
    let mut h = hdr;
    h.status = st;
    h.method = match hdr.method {
        method::SET => method::GET_RESP,
        m => m | 0x80,
    };
    if hdr.method == sa_method::GET_TABLE {
        r[SA_ATTR_OFFSET..SA_ATTR_OFFSET + 2].fill(0);
    }
    if hdr.attr_id == sa_attr::MULTIPATH_RECORD {
        h.attr_id = sa_attr::PATH_RECORD;
    }
    h.write(&mut r);
    r[SA_SM_KEY..SA_SM_KEY + 8].fill(0);
    r[24..36].fill(0);
    Answer {
        mad: r,
        table: None,
        status_error: true,
    }
}

/// `osm_sa_respond`: one record to a Get, Set or Delete (none:
/// NO_RECORDS, several: TOO_MANY_RECORDS), a table to a GetTable or
/// GetMulti.
fn respond(req: &[u8; MAD_LEN], hdr: MadHdr, size: usize, recs: Vec<Vec<u8>>) -> Answer {
    let single = matches!(hdr.method, method::GET | method::SET | sa_method::DELETE);
    if single && recs.len() > 1 {
        return send_error(req, hdr, sa_status::TOO_MANY_RECORDS);
    }
    if single && recs.is_empty() {
        return send_error(req, hdr, sa_status::NO_RECORDS);
    }
    let step = padded(size);
    let mut r = [0u8; MAD_LEN];
    r[..SA_DATA].copy_from_slice(&req[..SA_DATA]);
    let mut h = hdr;
    h.status = 0;
    h.method = match hdr.method {
        method::SET => method::GET_RESP,
        m => m | 0x80,
    };
    if hdr.attr_id == sa_attr::MULTIPATH_RECORD {
        h.attr_id = sa_attr::PATH_RECORD;
    }
    h.write(&mut r);
    r[24..36].fill(0);
    r[SA_SM_KEY..SA_SM_KEY + 8].fill(0);
    let off = if recs.is_empty() { 0 } else { step / 8 };
    r[SA_ATTR_OFFSET..SA_ATTR_OFFSET + 2].copy_from_slice(&(off as u16).to_be_bytes());
    if single {
        let rec = &recs[0];
        let k = size.min(SA_DATA_LEN).min(rec.len());
        r[SA_DATA..SA_DATA + k].copy_from_slice(&rec[..k]);
        return Answer {
            mad: r,
            table: None,
            status_error: false,
        };
    }
    let mut data = vec![0u8; recs.len() * step];
    for (i, rec) in recs.iter().enumerate() {
        let k = size.min(rec.len());
        data[i * step..i * step + k].copy_from_slice(&rec[..k]);
    }
    Answer {
        mad: r,
        table: Some(data),
        status_error: false,
    }
}

/// RMPP header fields of one DATA segment `seg` (1-based) of `nsegs`
/// for a message of `data` bytes, written into `mad` with the segment's
/// 200 bytes (IBTA 13.6.2: PayloadLength in the first segment is the whole
/// message after the RMPP header, in the last the bytes it carries after
/// the RMPP header, 0 in between).
pub fn write_segment(mad: &mut [u8; MAD_LEN], data: &[u8], seg: u32, nsegs: u32) {
    let total = data.len();
    let off = (seg as usize).saturating_sub(1) * SA_DATA_LEN;
    let chunk = data.get(off..total.min(off + SA_DATA_LEN)).unwrap_or(&[]);
    mad[24] = 1; // RMPPVersion
    mad[25] = 1; // DATA
    let mut flags = 0x01; // active
    if seg == 1 {
        flags |= 0x02;
    }
    if seg == nsegs {
        flags |= 0x04;
    }
    mad[26] = 0x1f << 3 | flags; // no response time
    mad[27] = 0;
    mad[28..32].copy_from_slice(&seg.to_be_bytes());
    let paylen = if seg == 1 {
        20 + total
    } else if seg == nsegs {
        20 + chunk.len()
    } else {
        0
    };
    mad[32..36].copy_from_slice(&(paylen as u32).to_be_bytes());
    mad[SA_DATA..].fill(0);
    mad[SA_DATA..SA_DATA + chunk.len()].copy_from_slice(chunk);
}

/// Segments a message of `len` data bytes takes (at least 1).
pub fn segments(len: usize) -> u32 {
    len.div_ceil(SA_DATA_LEN).max(1) as u32
}

/// IBTA rate code of a port's link (`ib_port_info_compute_rate`):
/// LinkWidthActive x LinkSpeedExtActive where the port's CapabilityMask
/// says it has extended speeds (IsExtendedSpeedsSupported) and one is
/// active, else LinkWidthActive x LinkSpeedActive. For a switch's external
/// port, whose own CapabilityMask is 0, see [`link_rate_ext`].
pub fn link_rate(info: &[u8; 64]) -> u8 {
    link_rate_ext(info, be32(info, 20) & CAP_HAS_EXT_SPEEDS != 0)
}

/// PortInfo CapabilityMask IsExtendedSpeedsSupported.
pub const CAP_HAS_EXT_SPEEDS: u32 = 0x4000;

/// [`link_rate`] with whether extended speeds count given: for a switch
/// port, by the CapabilityMask of the switch's port 0 (OpenSM's
/// `p0_extended`).
pub fn link_rate_ext(info: &[u8; 64], extended: bool) -> u8 {
    // Rate codes by width: 1x, 2x, 4x, 8x, 12x.
    let by_width = |codes: [u8; 5]| match info[31] {
        16 => codes[1],
        2 => codes[2],
        4 => codes[3],
        8 => codes[4],
        _ => codes[0],
    };
    if extended {
        match info[62] >> 4 {
            1 => return by_width([11, 19, 12, 13, 14]),
            2 => return by_width([15, 20, 16, 17, 18]),
            4 => return by_width([20, 16, 17, 21, 22]),
            _ => {}
        }
    }
    match info[35] >> 4 {
        2 => by_width([5, 3, 6, 7, 8]),
        4 => by_width([3, 6, 7, 9, 10]),
        _ => by_width([2, 5, 3, 6, 4]),
    }
}

/// A rate code's Gb/s x 10 for ordering (OpenSM's `ordered_rates`: the
/// 64b/66b-coded rates by their 8b/10b equivalent, 56 Gb/s as 68).
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

/// Whether a rate code is one OpenSM 3.3.23 knows (`ib_rate_is_valid`:
/// 2.5 to 600 Gb/s).
pub fn rate_is_valid(code: u8) -> bool {
    (2..=22).contains(&code)
}

/// Whether an MTU code is one the IBTA defines.
pub fn mtu_is_valid(code: u8) -> bool {
    (1..=5).contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_paddings() {
        let mut i = [0u8; 64];
        i[31] = 2;
        i[35] = 0x40;
        assert_eq!(link_rate(&i), 7, "4x QDR is 40 Gb/s");
        i[35] = 0x10;
        assert_eq!(link_rate(&i), 3, "4x SDR is 10 Gb/s");
        assert_eq!(padded(NODE_RECORD_LEN), 112);
        assert_eq!(padded(PORTINFO_RECORD_LEN), 72);
        assert!(rate_value(7) > rate_value(4) && rate_value(4) > rate_value(6));
        // 4x FDR: 56 Gb/s where the port has extended speeds, as OpenSM
        // rates it; the 10 Gb/s lane rate (QDR, 40) where it has not.
        i[35] = 0x40;
        i[62] = 0x11;
        assert_eq!(link_rate(&i), 7);
        i[20..24].copy_from_slice(&CAP_HAS_EXT_SPEEDS.to_be_bytes());
        assert_eq!(link_rate(&i), 12, "4x FDR is 56 Gb/s");
        assert_eq!(link_rate_ext(&i, false), 7);
        assert!(rate_value(12) > rate_value(7) && rate_value(11) < rate_value(6));
    }
}
