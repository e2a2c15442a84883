//! SwitchInfoRecord, after OpenSM's `osm_sa_sw_info_record.c`: every switch's SwitchInfo under its LID, filtered by LID.

use alloc::vec::Vec;

use hal::be::get_be16;
use ib_core::mad::{Mad, method};

use super::{Answer, has, rec};
use crate::ib_types::{sa_method, status};
use crate::sm::Sm;

/// SwitchInfoRecord size (LID, reserved, SwitchInfo).
pub const SWITCH_INFO_RECORD_LEN: usize = 24;

/// `osm_sir_rcv_process`.
pub fn process(sm: &Sm, m: &Mad) -> Answer {
    if m.method() != method::GET && m.method() != sa_method::GET_TABLE {
        return Answer::Error(status::UNSUP_METHOD_ATTR);
    }
    let cm = super::comp_mask(m);
    let q = rec(m);
    let mut out = Vec::new();
    if has(cm, 0) && get_be16(q, 0) == 0 {
        return Answer::Records(SWITCH_INFO_RECORD_LEN, out);
    }
    for n in sm.done.switches() {
        let Some(sw) = n.sw.as_ref() else { continue };
        let lid = super::lid_of(sm, n.guid());
        if lid == 0 || has(cm, 0) && lid != get_be16(q, 0) {
            continue;
        }
        let mut r = alloc::vec![0u8; SWITCH_INFO_RECORD_LEN];
        r[0..2].copy_from_slice(&lid.to_be_bytes());
        r[4..24].copy_from_slice(&sw.info.0[..20]);
        out.push(r);
    }
    Answer::Records(SWITCH_INFO_RECORD_LEN, out)
}
