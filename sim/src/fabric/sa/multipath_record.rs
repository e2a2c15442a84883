//! MultiPathRecord, after OpenSM's `osm_sa_multipath_record.c`: SubnAdmGetMulti with a list of source and destination GIDs, answered with the PathRecords between them (at most NumbPath), as a table of PathRecords.
//!
//! As OpenSM: only GetMulti is taken (another method: UNSUP_METHOD_ATTR);
//! no GID count, or a count of 0, is INSUF_COMPS; more GIDs than the
//! request carries is REQ_INVALID, as is an invalid MTU or rate with its
//! selector. The request arrives in one MAD here (room for 11 GIDs);
//! OpenSM's ranking of independent paths is left out (paths come in GID
//! order).

use super::path_record::{Wants, lid_pair_path};
use super::{
    Reply, Request, View, be16, be64, has, mtu_is_valid, rate_is_valid, sa_method, sa_status,
};
use crate::fabric::packet::mad_status;

/// Component bits (`IB_MPR_COMPMASK_*`).
mod mpr {
    pub const RAWTRAFFIC: u32 = 0;
    pub const REVERSIBLE: u32 = 5;
    pub const NUMBPATH: u32 = 6;
    pub const PKEY: u32 = 7;
    pub const SL: u32 = 9;
    pub const MTUSELEC: u32 = 10;
    pub const MTU: u32 = 11;
    pub const RATESELEC: u32 = 12;
    pub const RATE: u32 = 13;
    pub const PKTLIFETIMESELEC: u32 = 14;
    pub const PKTLIFETIME: u32 = 15;
    pub const SGIDCOUNT: u32 = 19;
    pub const DGIDCOUNT: u32 = 20;
}

/// `osm_mpr_rcv_process`.
pub fn process(v: &View, r: &Request) -> Reply {
    if r.method() != sa_method::GET_MULTI {
        return Reply::Error(mad_status::ATTR_UNSUPPORTED);
    }
    let (cm, q) = (r.cm, r.rec());
    if has(cm, mpr::RATESELEC) && has(cm, mpr::RATE) && !rate_is_valid(q[11] & 0x3f) {
        return Reply::Error(sa_status::REQ_INVALID);
    }
    if has(cm, mpr::MTUSELEC) && has(cm, mpr::MTU) && !mtu_is_valid(q[10] & 0x3f) {
        return Reply::Error(sa_status::REQ_INVALID);
    }
    if !has(cm, mpr::SGIDCOUNT) || !has(cm, mpr::DGIDCOUNT) {
        return Reply::Error(sa_status::INSUFFICIENT_COMPONENTS);
    }
    let (ns, nd) = (usize::from(q[15]), usize::from(q[16]));
    if ns == 0 || nd == 0 {
        return Reply::Error(sa_status::INSUFFICIENT_COMPONENTS);
    }
    // GIDs from byte 24 of the record: 11 fit in one MAD.
    if 24 + (ns + nd) * 16 > q.len() {
        return Reply::Error(sa_status::REQ_INVALID);
    }
    let gid_at = |i: usize| &q[24 + i * 16..40 + i * 16];
    let w = Wants {
        mtu: (has(cm, mpr::MTUSELEC) && has(cm, mpr::MTU)).then(|| (q[10] >> 6, q[10] & 0x3f)),
        rate: (has(cm, mpr::RATESELEC) && has(cm, mpr::RATE)).then(|| (q[11] >> 6, q[11] & 0x3f)),
        pkt_life: (has(cm, mpr::PKTLIFETIMESELEC) && has(cm, mpr::PKTLIFETIME))
            .then(|| (q[12] >> 6, q[12] & 0x3f)),
        pkey: has(cm, mpr::PKEY).then(|| be16(q, 6)),
        sl: has(cm, mpr::SL).then(|| (be16(q, 8) & 0xf) as u8),
        raw: has(cm, mpr::RAWTRAFFIC) && q[0] & 0x80 != 0,
    };
    let want_rev = has(cm, mpr::REVERSIBLE) && q[5] & 0x80 != 0;
    let limit = if has(cm, mpr::NUMBPATH) {
        usize::from(q[5] & 0x7f)
    } else {
        usize::MAX
    };
    let mut out: Vec<Vec<u8>> = Vec::new();
    'all: for i in 0..ns {
        let Some(s) = v.port_by_guid(be64(gid_at(i), 8)) else {
            continue;
        };
        for j in 0..nd {
            if out.len() >= limit {
                break 'all;
            }
            let Some(d) = v.port_by_guid(be64(gid_at(ns + j), 8)) else {
                continue;
            };
            if let Some(p) = lid_pair_path(v, s, d, &w, want_rev) {
                out.push(p);
            }
        }
    }
    Reply::Records(super::path_record::PATH_RECORD_LEN, out)
}
