//! MultiPathRecord, after OpenSM's `osm_sa_multipath_record.c`: SubnAdmGetMulti with a list of source and destination GIDs, answered with the PathRecords between them (at most NumbPath), as an RMPP transfer of PathRecords.
//!
//! As OpenSM: only GetMulti is taken (another method: UNSUP_METHOD_ATTR); no
//! GID, or a GID count beyond what the request carries, is INSUF_COMPS or
//! REQ_INVALID; an invalid MTU or rate with its selector is REQ_INVALID.
//! The request arrives in one MAD here (room for 11 GIDs); OpenSM's
//! path-independence ranking is left out (paths come in GID order).

use alloc::vec::Vec;

use hal::be::{get_be16, get_be64};
use ib_core::mad::Mad;

use super::path_record::{PATH_RECORD_LEN, Wants, lid_pair_path};
use super::{Answer, has, rec};
use crate::ib_types::{mtu_is_valid, rate_is_valid, sa_method, status};
use crate::sm::Sm;

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
pub fn process(sm: &Sm, m: &Mad, _requester: u16) -> Answer {
    if m.method() != sa_method::GET_MULTI {
        return Answer::Error(status::UNSUP_METHOD_ATTR);
    }
    let cm = super::comp_mask(m);
    let q = rec(m);
    if has(cm, mpr::RATESELEC) && has(cm, mpr::RATE) && !rate_is_valid(q[11] & 0x3f) {
        return Answer::Error(status::SA_REQ_INVALID);
    }
    if has(cm, mpr::MTUSELEC) && has(cm, mpr::MTU) && !mtu_is_valid(q[10] & 0x3f) {
        return Answer::Error(status::SA_REQ_INVALID);
    }
    if !has(cm, mpr::SGIDCOUNT) || !has(cm, mpr::DGIDCOUNT) {
        return Answer::Error(status::SA_INSUF_COMPS);
    }
    let (ns, nd) = (usize::from(q[15]), usize::from(q[16]));
    if ns == 0 || nd == 0 {
        return Answer::Error(status::SA_INSUF_COMPS);
    }
    // GIDs from byte 24 of the record: 11 fit in one MAD.
    if 24 + (ns + nd) * 16 > q.len() {
        return Answer::Error(status::SA_REQ_INVALID);
    }
    let gid_at = |i: usize| &q[24 + i * 16..40 + i * 16];
    let port = |g: &[u8]| sm.done.port_by_guid(get_be64(g, 8)).copied();
    let w = Wants {
        mtu: (has(cm, mpr::MTUSELEC) && has(cm, mpr::MTU)).then(|| (q[10] >> 6, q[10] & 0x3f)),
        rate: (has(cm, mpr::RATESELEC) && has(cm, mpr::RATE)).then(|| (q[11] >> 6, q[11] & 0x3f)),
        pkt_life: (has(cm, mpr::PKTLIFETIMESELEC) && has(cm, mpr::PKTLIFETIME))
            .then(|| (q[12] >> 6, q[12] & 0x3f)),
        pkey: has(cm, mpr::PKEY).then(|| get_be16(q, 6)),
        sl: has(cm, mpr::SL).then(|| (get_be16(q, 8) & 0xf) as u8),
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
        let Some(s) = port(gid_at(i)) else { continue };
        for j in 0..nd {
            if out.len() >= limit {
                break 'all;
            }
            let Some(d) = port(gid_at(ns + j)) else {
                continue;
            };
            if let Some(r) = lid_pair_path(sm, &s, &d, &w, want_rev) {
                out.push(r);
            }
        }
    }
    Answer::Records(PATH_RECORD_LEN, out)
}
