//! SMInfoRecord, after OpenSM's `osm_sa_sminfo_record.c`: this SM first (its LID, GUID, ActCount, priority and state), then every other SM it knows, filtered by LID, GUID, priority and state; the SM_Key is never shown.

use alloc::vec::Vec;

use hal::be::get_be16;
use ib_core::mad::{Mad, method};

use super::{Answer, has, rec};
use crate::ib_types::{SmInfo, sa_method, status};
use crate::sm::Sm;

/// SMInfoRecord size (LID, reserved, SMInfo, pad).
pub const SMINFO_RECORD_LEN: usize = 32;

fn record(lid: u16, s: &SmInfo) -> Vec<u8> {
    let mut r = alloc::vec![0u8; SMINFO_RECORD_LEN];
    r[0..2].copy_from_slice(&lid.to_be_bytes());
    let mut smi = *s;
    smi.sm_key = 0;
    smi.write(&mut r[4..25]);
    r
}

/// `osm_smir_rcv_process`.
pub fn process(sm: &Sm, m: &Mad) -> Answer {
    if m.method() != method::GET && m.method() != sa_method::GET_TABLE {
        return Answer::Error(status::UNSUP_METHOD_ATTR);
    }
    let cm = super::comp_mask(m);
    let q = rec(m);
    let want = SmInfo::read(&q[4..25]);
    let by_lid = if has(cm, 0) {
        match sm.done.port_by_lid(get_be16(q, 0)) {
            Some(e) => Some(e.guid),
            None => return Answer::Records(SMINFO_RECORD_LEN, Vec::new()),
        }
    } else {
        None
    };
    let pass = |s: &SmInfo| {
        !(has(cm, 2) && s.guid != want.guid
            || has(cm, 5) && s.priority != want.priority
            || has(cm, 6) && s.state != want.state)
    };
    let mut out = Vec::new();
    let me = sm.our_sminfo(false);
    if by_lid.is_none_or(|g| g == me.guid) && pass(&me) {
        out.push(record(sm.done.sm_lid, &me));
    }
    for (g, r) in &sm.remote_sms {
        if by_lid.is_some_and(|l| l != *g) {
            continue;
        }
        let Some(e) = sm.done.port_by_guid(*g) else {
            continue;
        };
        if pass(&r.smi) {
            out.push(record(e.lid, &r.smi));
        }
    }
    Answer::Records(SMINFO_RECORD_LEN, out)
}
