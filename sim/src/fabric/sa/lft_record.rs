//! LinearForwardingTableRecord, after OpenSM's `osm_sa_lft_record.c`: every block in use of every switch's LFT as the SM computed it, filtered by LID and block.

use super::{Reply, Request, View, be16, has};
use crate::fabric::packet::mad_status;

/// LFT record: LID, block, reserved, 64 entries.
pub const LFT_RECORD_LEN: usize = 72;

/// `osm_lftr_rcv_process`.
pub fn process(v: &View, r: &Request) -> Reply {
    if !r.is_query() {
        return Reply::Error(mad_status::ATTR_UNSUPPORTED);
    }
    let (cm, q) = (r.cm, r.rec());
    let mut out = Vec::new();
    for e in v.switches() {
        let Some(lft) = v.lfts.get(&e.node_guid).filter(|l| !l.is_empty()) else {
            continue;
        };
        if e.lid == 0 || has(cm, 0) && e.lid != be16(q, 0) {
            continue;
        }
        let max_block = (lft.len() - 1) / 64;
        let (lo, hi) = if has(cm, 1) {
            let b = usize::from(be16(q, 2));
            if b > max_block {
                continue;
            }
            (b, b)
        } else {
            (0, max_block)
        };
        for b in lo..=hi {
            let mut rec = vec![0xffu8; LFT_RECORD_LEN];
            rec[0..2].copy_from_slice(&e.lid.to_be_bytes());
            rec[2..4].copy_from_slice(&(b as u16).to_be_bytes());
            rec[4..8].fill(0);
            for (i, x) in rec[8..72].iter_mut().enumerate() {
                if let Some(&p) = lft.get(b * 64 + i) {
                    *x = p;
                }
            }
            out.push(rec);
        }
    }
    Reply::Records(LFT_RECORD_LEN, out)
}
