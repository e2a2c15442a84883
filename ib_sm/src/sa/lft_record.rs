//! LinearForwardingTableRecord, after OpenSM's `osm_sa_lft_record.c`: every block in use (up to LinearFDBTop) of every switch's LFT, filtered by LID and block.

use alloc::vec::Vec;

use hal::be::get_be16;
use ib_core::mad::{Mad, method};

use super::{Answer, has, rec};
use crate::ib_types::{LFT_NO_PATH, sa_method, status};
use crate::sm::Sm;

/// LFT record size (LID, block, reserved, 64 entries).
pub const LFT_RECORD_LEN: usize = 72;

/// `osm_lftr_rcv_process`.
pub fn process(sm: &Sm, m: &Mad) -> Answer {
    if m.method() != method::GET && m.method() != sa_method::GET_TABLE {
        return Answer::Error(status::UNSUP_METHOD_ATTR);
    }
    let cm = super::comp_mask(m);
    let q = rec(m);
    let mut out = Vec::new();
    for n in sm.done.switches() {
        let Some(sw) = n.sw.as_ref() else { continue };
        let lid = super::lid_of(sm, n.guid());
        if lid == 0 || has(cm, 0) && lid != get_be16(q, 0) {
            continue;
        }
        if sw.lft.is_empty() {
            continue;
        }
        let max_block = (sw.lft.len() - 1) / 64;
        let (lo, hi) = if has(cm, 1) {
            let b = usize::from(get_be16(q, 2));
            if b > max_block {
                continue;
            }
            (b, b)
        } else {
            (0, max_block)
        };
        for b in lo..=hi {
            let mut r = alloc::vec![LFT_NO_PATH; LFT_RECORD_LEN];
            r[0..2].copy_from_slice(&lid.to_be_bytes());
            r[2..4].copy_from_slice(&(b as u16).to_be_bytes());
            r[4..8].fill(0);
            for (i, e) in r[8..72].iter_mut().enumerate() {
                if let Some(&p) = sw.lft.get(b * 64 + i) {
                    *e = p;
                }
            }
            out.push(r);
        }
    }
    Answer::Records(LFT_RECORD_LEN, out)
}
