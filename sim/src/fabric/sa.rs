//! The subnet administrator beside the embedded SM.
//!
//! The subnet administrator beside the embedded SM ([`super::sm`]):
//! SubnAdmGet and SubnAdmGetTable of PathRecord (by DGID/SGID or
//! DLID/SLID, with MTU, rate and packet-lifetime selectors, SL and P_Key),
//! NodeRecord and PortInfoRecord, and ClassPortInfo, answered from the last
//! heavy sweep; a GetTable answer is the records as one RMPP message,
//! which the SM ([`super::sm`]) sends as segments of 200 bytes under the
//! receiver's window (IBTA 13.6: DATA segments, ACKs, resends on timeout,
//! STOP/ABORT). ServiceRecord, MCMemberRecord, InformInfo, SA Set/Delete,
//! SM_Key checks and multi-segment requests are not here.
//!
//! Layouts are the IBTA's (vol. 1, 15.2.1 SA MAD: RMPP header at byte 24,
//! SM_Key at 36, AttributeOffset at 44, ComponentMask at 48, data at 56;
//! 15.2.5.16 PathRecord, 15.2.5.2 NodeRecord, 15.2.5.3 PortInfoRecord),
//! with OpenSM's answers as facts (selectors 2 "exactly" in responses,
//! HopLimit 0 inside the subnet, Reversible with NumbPath 0, PacketLifeTime
//! 0 on a loopback path, an unknown port GUID answered "no records" as
//! OpenSM 3.3.23 was seen to do; newer OpenSM says "invalid GID").

use std::collections::BTreeMap;

use super::sm::{EndPort, SmConfig};
use crate::fabric::packet::{MAD_LEN, MadHdr, mad_status, method};

/// SA class version.
pub const SA_CLASS_VERSION: u8 = 2;
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
    pub const PATH_RECORD: u16 = 0x0035;
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

/// Record sizes on the wire and padded to 8 bytes (AttributeOffset).
pub const PATH_RECORD_LEN: usize = 64;
/// NodeRecord: LID, reserved, NodeInfo (40), NodeDescription (64).
pub const NODE_RECORD_LEN: usize = 108;
/// PortInfoRecord: EndportLID, PortNum, Options, PortInfo (64).
pub const PORTINFO_RECORD_LEN: usize = 68;

fn padded(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// What the SA reads: the SM's last sweep.
#[derive(Debug)]
pub struct View<'a> {
    /// End ports with their LIDs.
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
}

/// The SA's answer to one MAD.
#[derive(Debug)]
pub struct Answer {
    /// The response MAD (for a GetTable answer: its headers, the RMPP
    /// header and data left for the sender to fill in per segment).
    pub mad: [u8; MAD_LEN],
    /// A GetTable answer: every record, each padded to AttributeOffset
    /// 8-byte words, to be sent as RMPP segments.
    pub table: Option<Vec<u8>>,
    /// The status is an error.
    pub status_error: bool,
}

/// RMPP header fields of one DATA segment `seg` (1-based) of `nsegs`
/// for a message of `total` data bytes, written into `mad` with the
/// segment's 200 bytes of `data` (IBTA 13.6.2: PayloadLength in the first
/// segment is the whole message after the RMPP header, in the last the
/// bytes it carries after the RMPP header, 0 in between).
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

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be64(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(x)
}

/// Answers one SA request MAD from the requester at `requester_lid`.
pub fn answer(v: &View, req: &[u8; MAD_LEN], requester_lid: u16) -> Answer {
    let mut r = *req;
    let hdr = MadHdr::parse(req).unwrap_or_default();
    let mut h = hdr;
    let get = hdr.method == method::GET;
    let table = hdr.method == method::GET_TABLE;
    h.method = if table {
        GET_TABLE_RESP
    } else {
        method::GET_RESP
    };
    r[24..36].fill(0); // RMPP header
    r[SA_DATA..].fill(0);
    let mut table_data = None;
    let status = if hdr.base_version != 1 || hdr.class_version != SA_CLASS_VERSION {
        mad_status::BAD_VERSION
    } else if !get && !table {
        mad_status::METHOD_UNSUPPORTED
    } else {
        let cm = be64(req, 48);
        let data = &req[SA_DATA..];
        let recs: Result<(usize, Vec<Vec<u8>>), u16> = match hdr.attr_id {
            sa_attr::CLASS_PORT_INFO if get => {
                r[SA_DATA] = 1; // BaseVersion
                r[SA_DATA + 1] = SA_CLASS_VERSION;
                // RespTimeValue: 4.096 µs * 2^18 (about 1 s), as OpenSM.
                r[SA_DATA + 7] = 18;
                h.status = 0;
                h.write(&mut r);
                return Answer {
                    mad: r,
                    table: None,
                    status_error: false,
                };
            }
            sa_attr::PATH_RECORD => {
                path_records(v, data, cm, requester_lid, table).map(|x| (PATH_RECORD_LEN, x))
            }
            sa_attr::NODE_RECORD => Ok((NODE_RECORD_LEN, node_records(v, data, cm))),
            sa_attr::PORTINFO_RECORD => Ok((PORTINFO_RECORD_LEN, portinfo_records(v, data, cm))),
            _ => Err(mad_status::ATTR_UNSUPPORTED),
        };
        match recs {
            Err(s) => s,
            Ok((len, recs)) => {
                let step = padded(len);
                r[44..46].copy_from_slice(&((step / 8) as u16).to_be_bytes());
                if get {
                    match recs.len() {
                        0 => sa_status::NO_RECORDS,
                        1 => {
                            r[SA_DATA..SA_DATA + len].copy_from_slice(&recs[0][..len]);
                            0
                        }
                        _ => sa_status::TOO_MANY_RECORDS,
                    }
                } else {
                    let mut data = vec![0u8; recs.len() * step];
                    for (i, rec) in recs.iter().enumerate() {
                        data[i * step..i * step + len].copy_from_slice(&rec[..len]);
                    }
                    table_data = Some(data);
                    0
                }
            }
        }
    };
    h.status = status;
    h.write(&mut r);
    Answer {
        mad: r,
        table: table_data,
        status_error: status != 0,
    }
}

// ------------------------------------------------------------ PathRecord

mod pcm {
    pub const DGID: u64 = 1 << 2;
    pub const SGID: u64 = 1 << 3;
    pub const DLID: u64 = 1 << 4;
    pub const SLID: u64 = 1 << 5;
    pub const RAW_TRAFFIC: u64 = 1 << 6;
    pub const NUMB_PATH: u64 = 1 << 12;
    pub const PKEY: u64 = 1 << 13;
    pub const SL: u64 = 1 << 15;
    pub const MTU_SELECTOR: u64 = 1 << 16;
    pub const MTU: u64 = 1 << 17;
    pub const RATE_SELECTOR: u64 = 1 << 18;
    pub const RATE: u64 = 1 << 19;
    pub const PLT_SELECTOR: u64 = 1 << 20;
    pub const PLT: u64 = 1 << 21;
}

/// The end port a GID names: Ok(None) for a port GUID not in the subnet.
fn by_gid<'a>(v: &'a View, gid: &[u8]) -> Result<Option<&'a EndPort>, u16> {
    if be64(gid, 0) != v.cfg.subnet_prefix {
        return Err(sa_status::INVALID_GID);
    }
    let g = be64(gid, 8);
    Ok(v.ports.iter().find(|p| p.port_guid == g))
}

fn by_lid<'a>(v: &'a View, lid: u16) -> Option<&'a EndPort> {
    v.ports.iter().find(|p| p.lid == lid)
}

/// IBTA rate code of a link: LinkWidthActive x LinkSpeedActive.
fn link_rate(info: &[u8; 64]) -> u8 {
    let lanes: u32 = match info[31] {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        _ => 1,
    };
    let lane_tenths: u32 = match info[35] >> 4 {
        2 => 50,
        4 => 100,
        _ => 25,
    };
    match lanes * lane_tenths {
        25 => 2,
        50 => 5,
        100 => 3,
        200 => 6,
        300 => 4,
        400 => 7,
        600 => 8,
        800 => 9,
        1200 => 10,
        _ => 2,
    }
}

/// Gb/s x 10 of a rate code, to compare rates.
fn rate_value(code: u8) -> u32 {
    match code {
        2 => 25,
        5 => 50,
        3 => 100,
        6 => 200,
        4 => 300,
        7 => 400,
        8 => 600,
        9 => 800,
        10 => 1200,
        _ => 0,
    }
}

/// MTU (code) and rate (code) along the LID route from `src` to `dst`:
/// the smallest MTUCap and slowest link on the way. `None` if the LFTs
/// lead nowhere.
fn path_props(v: &View, src: &EndPort, dst: &EndPort) -> Option<(u8, u8)> {
    let mut mtu = (src.port_info[41] & 0xf).min(dst.port_info[41] & 0xf);
    // Both end links count (each end reports its own link's speed).
    let mut rate = link_rate(&src.port_info);
    if rate_value(link_rate(&dst.port_info)) < rate_value(rate) {
        rate = link_rate(&dst.port_info);
    }
    if src.port_guid == dst.port_guid {
        return Some((mtu, rate));
    }
    let mut at = (src.node_guid, src.port);
    // A CA port: step over its cable first.
    if src.node_type != 2 {
        at = *v.links.get(&at)?;
    }
    for _ in 0..64 {
        let (node, in_port) = at;
        if node == dst.node_guid {
            // Arrived: a CA on the port asked for, a switch on any.
            return (dst.node_type == 2 || in_port == dst.port).then_some((mtu, rate));
        }
        let lft = v.lfts.get(&node)?;
        let out = *lft.get(usize::from(dst.lid))?;
        if out == 0 || out == 0xff {
            return None;
        }
        for p in [in_port, out] {
            if let Some(i) = v.port_infos.get(&(node, p)) {
                mtu = mtu.min(i[41] & 0xf);
                if rate_value(link_rate(i)) < rate_value(rate) {
                    rate = link_rate(i);
                }
            }
        }
        at = *v.links.get(&(node, out))?;
    }
    None
}

/// Whether `have` satisfies `want` under a selector (0 greater than, 1
/// less than, 2 exactly, 3 largest available).
fn selected(sel: u8, have: u32, want: u32) -> bool {
    match sel {
        0 => have > want,
        1 => have < want,
        2 => have == want,
        _ => true,
    }
}

fn path_records(
    v: &View,
    d: &[u8],
    cm: u64,
    requester_lid: u16,
    table: bool,
) -> Result<Vec<Vec<u8>>, u16> {
    // Sources.
    let srcs: Vec<&EndPort> = if cm & pcm::SGID != 0 {
        by_gid(v, &d[24..40])?.into_iter().collect()
    } else if cm & pcm::SLID != 0 {
        by_lid(v, be16(d, 42)).into_iter().collect()
    } else {
        by_lid(v, requester_lid).into_iter().collect()
    };
    let dsts: Vec<&EndPort> = if cm & pcm::DGID != 0 {
        by_gid(v, &d[8..24])?.into_iter().collect()
    } else if cm & pcm::DLID != 0 {
        by_lid(v, be16(d, 40)).into_iter().collect()
    } else if table {
        v.ports.iter().collect()
    } else {
        return Err(sa_status::INSUFFICIENT_COMPONENTS);
    };
    if cm & pcm::RAW_TRAFFIC != 0 && d[44] & 0x80 != 0 {
        return Ok(Vec::new());
    }
    if cm & pcm::NUMB_PATH != 0 && d[49] & 0x7f == 0 {
        // NumbPath 0 asks for no path (OpenSM answers none).
        return Ok(Vec::new());
    }
    let pkey = if cm & pcm::PKEY != 0 {
        let k = be16(d, 50);
        if k & 0x7fff != 0x7fff {
            return Ok(Vec::new());
        }
        k
    } else {
        0xffff
    };
    let sl = if cm & pcm::SL != 0 {
        (be16(d, 52) & 0xf) as u8
    } else {
        v.cfg.sm_sl & 0xf
    };
    let mut out = Vec::new();
    for s in &srcs {
        for t in &dsts {
            let Some((mtu, rate)) = path_props(v, s, t) else {
                continue;
            };
            if cm & pcm::MTU != 0 {
                let sel = if cm & pcm::MTU_SELECTOR != 0 {
                    d[54] >> 6
                } else {
                    2
                };
                if !selected(sel, u32::from(mtu), u32::from(d[54] & 0x3f)) {
                    continue;
                }
            }
            if cm & pcm::RATE != 0 {
                let sel = if cm & pcm::RATE_SELECTOR != 0 {
                    d[55] >> 6
                } else {
                    2
                };
                if !selected(sel, rate_value(rate), rate_value(d[55] & 0x3f)) {
                    continue;
                }
            }
            // A loopback path has PacketLifeTime 0 (IBTA table 205).
            let plt = if s.port_guid == t.port_guid {
                0
            } else {
                v.cfg.packet_life_time & 0x3f
            };
            if cm & pcm::PLT != 0 {
                let sel = if cm & pcm::PLT_SELECTOR != 0 {
                    d[56] >> 6
                } else {
                    2
                };
                if !selected(sel, u32::from(plt), u32::from(d[56] & 0x3f)) {
                    continue;
                }
            }
            let mut rec = vec![0u8; PATH_RECORD_LEN];
            let gid = |g: u64| {
                let mut x = [0u8; 16];
                x[..8].copy_from_slice(&v.cfg.subnet_prefix.to_be_bytes());
                x[8..].copy_from_slice(&g.to_be_bytes());
                x
            };
            rec[8..24].copy_from_slice(&gid(t.port_guid));
            rec[24..40].copy_from_slice(&gid(s.port_guid));
            rec[40..42].copy_from_slice(&t.lid.to_be_bytes());
            rec[42..44].copy_from_slice(&s.lid.to_be_bytes());
            // RawTraffic 0, FlowLabel 0, HopLimit 0 (inside the subnet).
            rec[48] = 0; // TClass
            rec[49] = 0x80; // Reversible; NumbPath 0 in answers (as OpenSM)
            rec[50..52].copy_from_slice(&pkey.to_be_bytes());
            rec[52..54].copy_from_slice(&u16::from(sl).to_be_bytes());
            rec[54] = 2 << 6 | mtu;
            rec[55] = 2 << 6 | rate;
            rec[56] = 2 << 6 | plt;
            out.push(rec);
        }
    }
    Ok(out)
}

// ------------------------------------------------------------ NodeRecord

fn node_records(v: &View, d: &[u8], cm: u64) -> Vec<Vec<u8>> {
    let ni = &d[4..44];
    v.ports
        .iter()
        .filter(|p| {
            (cm & 1 == 0 || p.lid == be16(d, 0))
                && (cm & (1 << 4) == 0 || p.node_info[2] == ni[2])
                && (cm & (1 << 5) == 0 || p.node_info[3] == ni[3])
                && (cm & (1 << 6) == 0 || p.node_info[4..12] == ni[4..12])
                && (cm & (1 << 7) == 0 || p.node_info[12..20] == ni[12..20])
                && (cm & (1 << 8) == 0 || p.node_info[20..28] == ni[20..28])
                && (cm & (1 << 12) == 0 || p.node_info[36] == ni[36])
                && (cm & (1 << 14) == 0 || p.description[..] == d[44..108])
        })
        .map(|p| {
            let mut rec = vec![0u8; NODE_RECORD_LEN];
            rec[0..2].copy_from_slice(&p.lid.to_be_bytes());
            rec[4..44].copy_from_slice(&p.node_info);
            rec[44..108].copy_from_slice(&p.description);
            rec
        })
        .collect()
}

// -------------------------------------------------------- PortInfoRecord

fn portinfo_records(v: &View, d: &[u8], cm: u64) -> Vec<Vec<u8>> {
    let lid = be16(d, 0);
    let port = d[2];
    let mut out = Vec::new();
    for e in v.ports {
        if cm & 1 != 0 && e.lid != lid {
            continue;
        }
        // A switch answers for each of its ports under its LID.
        let nums: Vec<u8> = if e.node_type == 2 {
            let n = e.node_info[3];
            (0..=n).collect()
        } else {
            vec![e.port]
        };
        for p in nums {
            if cm & 2 != 0 && p != port {
                continue;
            }
            let info = if e.node_type == 2 && p != 0 {
                match v.port_infos.get(&(e.node_guid, p)) {
                    Some(i) => *i,
                    None => continue,
                }
            } else {
                e.port_info
            };
            let mut rec = vec![0u8; PORTINFO_RECORD_LEN];
            rec[0..2].copy_from_slice(&e.lid.to_be_bytes());
            rec[2] = p;
            rec[4..68].copy_from_slice(&info);
            // The M_Key is not shown to SA clients.
            rec[4..12].fill(0);
            out.push(rec);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_selectors() {
        let mut i = [0u8; 64];
        i[31] = 2;
        i[35] = 0x40;
        assert_eq!(link_rate(&i), 7, "4x QDR is 40 Gb/s");
        i[35] = 0x10;
        assert_eq!(link_rate(&i), 3, "4x SDR is 10 Gb/s");
        assert!(selected(0, 5, 4) && !selected(0, 4, 4));
        assert!(selected(1, 3, 4) && selected(2, 4, 4) && selected(3, 1, 9));
        assert_eq!(padded(NODE_RECORD_LEN), 112);
        assert_eq!(padded(PORTINFO_RECORD_LEN), 72);
    }
}
